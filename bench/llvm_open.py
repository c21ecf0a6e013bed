"""How late a 1 ms asyncio ticker fires while another thread opens llvmlite's LLVM library
(Note [LLVM's library loads without the GIL] in src/asyncgrad/ops/kernels/loader.py), each
way in a fresh process, in turn:

* ``ctypes.CDLL(path)``, as llvmlite's import does: ``dlopen`` with the GIL held;
* a foreign ``dlopen`` through ctypes, as the loader does first: the GIL released.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python -m bench.llvm_open [--rounds 3]

The library is read from the page cache after the first round; a cold one (after a
reboot, or evicted) takes longer to open, and the held GIL as long.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

CHILD = r"""
import asyncio, ctypes, importlib.util, os, pathlib, sys, threading, time
spec = importlib.util.find_spec("llvmlite")
path = next(pathlib.Path(list(spec.submodule_search_locations)[0], "binding").glob("libllvmlite*"))
how = sys.argv[1]

def open_library():
    if how == "ctypes.CDLL":
        ctypes.CDLL(str(path))
    else:
        dlopen = ctypes.CDLL(None).dlopen
        dlopen.argtypes, dlopen.restype = (ctypes.c_char_p, ctypes.c_int), ctypes.c_void_p
        dlopen(os.fsencode(path), os.RTLD_NOW | os.RTLD_LOCAL)

async def main():
    lags = []
    async def ticker():
        while True:
            t = time.perf_counter()
            await asyncio.sleep(0.001)
            lags.append(time.perf_counter() - t - 0.001)
    tick = asyncio.ensure_future(ticker())
    await asyncio.sleep(0.05)
    lags.clear()
    t = time.perf_counter()
    opener = threading.Thread(target=open_library)
    opener.start()
    while opener.is_alive():
        await asyncio.sleep(0.002)
    took = time.perf_counter() - t
    await asyncio.sleep(0.005)
    tick.cancel()
    print(took * 1e3, max(lags) * 1e3)

asyncio.run(main())
"""
WAYS = ("ctypes.CDLL", "foreign dlopen")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    got: dict[str, list[tuple[float, float]]] = {w: [] for w in WAYS}
    for _ in range(args.rounds):
        for way in WAYS:
            out = subprocess.run([sys.executable, "-c", CHILD, way], capture_output=True, text=True, check=True)
            took, lag = map(float, out.stdout.split())
            got[way].append((took, lag))
    print("| how the library is opened | open ms | ticker's worst lateness ms |\n|---|---|---|")
    for way, runs in got.items():
        print(f"| {way} | {statistics.median(t for t, _ in runs):.1f} | {statistics.median(g for _, g in runs):.1f} |")


if __name__ == "__main__":
    main()
