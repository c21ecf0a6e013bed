"""ops: forward and backward of each op a transformer, an MLP or a classifier uses, float32,
at two sizes, asyncgrad beside PyTorch in the same run (issue 15).

Sizes: ``small`` is the GPT of the transformer workload (batch 16, block 64, 128 dims,
4 heads, vocab 65); ``large`` is batch 32, block 128, 256 dims, 8 heads, vocab 512. The
image layers (conv2d, pooling, batch norm) run on 16 images of 16 x 32 x 32 (small) and 32
of 64 x 16 x 16 (large), with as many output channels as input ones.

Each op is measured as four cases, interleaved round by round with the order rotating
(asyncgrad forward, torch forward, asyncgrad backward, torch backward, and asyncgrad
backward with every node inline), medians reported. "bwd inline" runs the same backward on
an ``Engine(inline_threshold=2**62)``: the kernel alone, without the default engine's hop
of large nodes to a worker thread, which on a busy machine costs milliseconds.
The forward is timed with its inputs requiring grad (it records the graph, as in training);
the backward is timed from a graph built untimed, with a fixed random output gradient.
Both libraries run on one thread (numpy's BLAS limited to 1, ``torch.set_num_threads(1)``):
the table compares kernels, and on a shared 2-core machine two libraries' spinning thread
pools (OpenBLAS's and PyTorch's OpenMP) otherwise slow each other by up to 10x; the
``transformer`` workload measures both with their default threads. The ratio column is
asyncgrad / torch.

The cyclic garbage collector runs once per round, before the round's cases, and is off
while they run. Collected before each timed call instead, every call ran just after a
walk over every Python object of the process (torch's included): with caches no serving
process has, which cost the Python side of an engine more than a C++ one, and most of
the workload's time spent collecting.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..common import ASYNCGRAD, BLAS, TORCH, About, Column, Result, Target, median, no_gc

ABOUT = About(
    title="Operations, one by one, beside PyTorch",
    measures="Forward and backward time of each operation a transformer, an MLP or a classifier uses, float32, "
             "at the size of a small GPT (batch 16, block 64, 128 dims, 4 heads) and a larger one (batch 32, "
             "block 128, 256 dims, 8 heads), both libraries on one thread. \"bwd inline\" runs the backward "
             "with every node on the loop's thread: the kernels' own cost, without the hop to a worker thread. "
             "Each round of a cell's cases runs after one garbage collection, with the collector off.",
    reading="Each \"x torch\" column is asyncgrad's time over PyTorch's: below 1 asyncgrad is faster. numpy has "
            "no fused kernels and no erf, so operations made of several passes (softmax, layer_norm, exact "
            "GELU) cost more than PyTorch's single fused pass; matrix products run at PyTorch's speed.",
    plots=(("fwd_ratio", "forward x torch", False), ("bwd_inline_ratio", "backward (inline) x torch", False)),
)

DEFAULT_ROUNDS = 9
SIZES = {
    "small": {"B": 16, "T": 64, "C": 128, "H": 4, "V": 65},
    "large": {"B": 32, "T": 128, "C": 256, "H": 8, "V": 512},
}


@dataclass
class OpCase:
    """One op: ``make(rng, size)`` gives the numpy inputs (float arrays become leaves that
    require grad, integer arrays stay constants); ``ag``/``torch`` map the library's inputs
    to the op's output."""

    name: str
    make: Callable[[np.random.Generator, dict[str, int]], list[np.ndarray]]
    ag: Callable[..., Any]
    torch: Callable[..., Any]


def _f32(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def _causal(T: int) -> np.ndarray:
    return np.tril(np.ones((T, T), dtype=bool))


def _cases() -> list[OpCase]:
    import asyncgrad as ag
    import asyncgrad.nn.functional as AF

    try:
        import torch
        import torch.nn.functional as TF
    except ImportError:  # asyncgrad alone: the torch column stays empty
        torch = TF = None  # type: ignore[assignment]

    def heads(s: dict[str, int]) -> tuple[int, int, int, int]:
        return s["B"], s["H"], s["T"], s["C"] // s["H"]

    def mask_ag(x: Any) -> Any:
        return ag.where(_causal(x.shape[-1]), x, -math.inf)

    def mask_torch(x: Any) -> Any:
        return x.masked_fill(~torch.from_numpy(_causal(x.shape[-1])), float("-inf"))

    def ce_inputs(r: np.random.Generator, s: dict[str, int]) -> list[np.ndarray]:
        return [_f32(r, s["B"] * s["T"], s["V"]), r.integers(0, s["V"], s["B"] * s["T"])]

    def bt(s: dict[str, int], c: int) -> tuple[int, int, int]:
        return s["B"], s["T"], c

    return [
        OpCase("matmul 4-D (q @ k^T)", lambda r, s: [_f32(r, *heads(s)), _f32(r, *heads(s))],
               lambda q, k: q @ k.transpose(-2, -1), lambda q, k: q @ k.transpose(-2, -1)),
        OpCase("bmm 3-D (att @ v)", lambda r, s: [_f32(r, s["B"] * s["H"], s["T"], s["T"]),
                                                  _f32(r, s["B"] * s["H"], s["T"], s["C"] // s["H"])],
               lambda a, v: a @ v, lambda a, v: torch.bmm(a, v)),
        OpCase("linear C->4C", lambda r, s: [_f32(r, *bt(s, s["C"])), _f32(r, 4 * s["C"], s["C"]) * 0.05,
                                              _f32(r, 4 * s["C"])],
               AF.linear, lambda *a: TF.linear(*a)),
        OpCase("causal attention (sdpa)", lambda r, s: [_f32(r, *heads(s)), _f32(r, *heads(s)), _f32(r, *heads(s))],
               lambda q, k, v: AF.scaled_dot_product_attention(q, k, v, is_causal=True),
               lambda q, k, v: TF.scaled_dot_product_attention(q, k, v, is_causal=True)),
        OpCase("softmax (attention)", lambda r, s: [_f32(r, s["B"], s["H"], s["T"], s["T"])],
               lambda x: AF.softmax(x, -1), lambda x: TF.softmax(x, -1)),
        OpCase("log_softmax (logits)", lambda r, s: [_f32(r, s["B"] * s["T"], s["V"])],
               lambda x: AF.log_softmax(x, -1), lambda x: TF.log_softmax(x, -1)),
        OpCase("cross_entropy", ce_inputs,
               lambda x, t: AF.cross_entropy(x, t), lambda x, t: TF.cross_entropy(x, torch.from_numpy(t))),
        OpCase("layer_norm", lambda r, s: [_f32(r, *bt(s, s["C"])), _f32(r, s["C"]), _f32(r, s["C"])],
               lambda x, w, b: AF.layer_norm(x, x.shape[-1:], w, b),
               lambda x, w, b: TF.layer_norm(x, x.shape[-1:], w, b)),
        OpCase("gelu exact", lambda r, s: [_f32(r, *bt(s, 4 * s["C"]))],
               AF.gelu, lambda x: TF.gelu(x)),
        OpCase("gelu tanh", lambda r, s: [_f32(r, *bt(s, 4 * s["C"]))],
               lambda x: AF.gelu(x, approximate="tanh"), lambda x: TF.gelu(x, approximate="tanh")),
        OpCase("embedding", lambda r, s: [r.integers(0, s["V"], (s["B"], s["T"])), _f32(r, s["V"], s["C"])],
               lambda i, w: AF.embedding(i, w), lambda i, w: TF.embedding(torch.from_numpy(i), w)),
        OpCase("transpose + reshape", lambda r, s: [_f32(r, *heads(s))],
               lambda y: y.transpose(1, 2).reshape((y.shape[0], y.shape[2], -1)),
               lambda y: y.transpose(1, 2).reshape(y.shape[0], y.shape[2], -1)),
        OpCase("where / masked_fill", lambda r, s: [_f32(r, s["B"], s["H"], s["T"], s["T"])],
               mask_ag, mask_torch),
        OpCase("exp", lambda r, s: [_f32(r, *bt(s, 4 * s["C"]))], ag.exp, lambda x: torch.exp(x)),
        OpCase("tanh", lambda r, s: [_f32(r, *bt(s, 4 * s["C"]))], ag.tanh, lambda x: torch.tanh(x)),
        OpCase("sigmoid", lambda r, s: [_f32(r, *bt(s, 4 * s["C"]))], ag.sigmoid, lambda x: torch.sigmoid(x)),
        OpCase("sum over last dim", lambda r, s: [_f32(r, *bt(s, 4 * s["C"]))],
               lambda x: x.sum(-1), lambda x: x.sum(-1)),
        OpCase("mean over last dim", lambda r, s: [_f32(r, *bt(s, 4 * s["C"]))],
               lambda x: x.mean(-1), lambda x: x.mean(-1)),
        OpCase("dropout p=0.1", lambda r, s: [_f32(r, *bt(s, 4 * s["C"]))],
               lambda x: AF.dropout(x, 0.1), lambda x: TF.dropout(x, 0.1)),
        # image layers (issue 32), on the images of IMAGES[size]
        OpCase("conv2d 3x3 pad 1", lambda r, s: [_f32(r, *_image(s)), _f32(r, *_conv_weight(s, 3)) * 0.1],
               lambda x, w: AF.conv2d(x, w, padding=1), lambda x, w: TF.conv2d(x, w, padding=1)),
        OpCase("conv2d 3x3 stride 2", lambda r, s: [_f32(r, *_image(s)), _f32(r, *_conv_weight(s, 3)) * 0.1],
               lambda x, w: AF.conv2d(x, w, stride=2, padding=1), lambda x, w: TF.conv2d(x, w, stride=2, padding=1)),
        OpCase("max_pool2d 2x2", lambda r, s: [_f32(r, *_image(s))],
               lambda x: AF.max_pool2d(x, 2), lambda x: TF.max_pool2d(x, 2)),
        OpCase("max_pool2d 3x3 stride 2", lambda r, s: [_f32(r, *_image(s))],
               lambda x: AF.max_pool2d(x, 3, 2, 1), lambda x: TF.max_pool2d(x, 3, 2, 1)),
        OpCase("avg_pool2d 2x2", lambda r, s: [_f32(r, *_image(s))],
               lambda x: AF.avg_pool2d(x, 2), lambda x: TF.avg_pool2d(x, 2)),
        OpCase("batch_norm 2d (train)",
               lambda r, s: [_f32(r, *_image(s)), _f32(r, _image(s)[1]), _f32(r, _image(s)[1])],
               lambda x, w, b: AF.batch_norm(x, None, None, w, b, training=True),
               lambda x, w, b: TF.batch_norm(x, None, None, w, b, training=True)),
    ]


# the image layers' inputs (N, C, H, W) at each size: a ResNet's first and a later stage
IMAGES = {"small": (16, 16, 32, 32), "large": (32, 64, 16, 16)}


def _image(s: dict[str, int]) -> tuple[int, int, int, int]:
    return IMAGES["small" if s["C"] == SIZES["small"]["C"] else "large"]


def _conv_weight(s: dict[str, int], k: int) -> tuple[int, int, int, int]:
    c = _image(s)[1]
    return (c, c, k, k)


def _recurrent_cases() -> list[OpCase]:
    """LSTM and GRU layers (issue 32): batch B, T steps, C input and C hidden features,
    batch_first; the output's gradient is the one fed back. The same weights in both
    libraries (PyTorch's, loaded through the state_dict)."""
    import asyncgrad as ag

    try:
        import torch
    except ImportError:
        torch = None  # type: ignore[assignment]

    def layers(kind: str, c: int) -> tuple[Any, Any]:
        mine = getattr(ag.nn, kind)(c, c, batch_first=True)
        if torch is None:
            return mine, None
        theirs = getattr(torch.nn, kind)(c, c, batch_first=True)
        mine.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
        return mine, theirs

    cases = []
    for kind in ("LSTM", "GRU"):
        made: dict[int, tuple[Any, Any]] = {}

        def pair(c: int, kind: str = kind, made: dict[int, tuple[Any, Any]] = made) -> tuple[Any, Any]:
            if c not in made:
                made[c] = layers(kind, c)
            return made[c]

        cases.append(OpCase(
            f"{kind} layer (B, T, C -> C)", lambda r, s: [_f32(r, s["B"], s["T"], s["C"])],
            lambda x, pair=pair: pair(x.shape[-1])[0](x)[0],
            lambda x, pair=pair: pair(x.shape[-1])[1](x)[0]))
    return cases


def _ag_impl(op: OpCase, arrays: list[np.ndarray], grad_seed: int) -> tuple[Callable[[], Any], Any]:
    import asyncgrad as ag

    leaves = [ag.from_numpy(a).requires_grad_() if a.dtype.kind == "f" else a for a in arrays]
    out_shape = op.ag(*leaves).shape
    g = ag.from_numpy(np.random.default_rng(grad_seed).standard_normal(out_shape).astype(np.float32))

    def forward() -> Any:
        return op.ag(*leaves)

    async def backward(out: Any) -> None:
        await ag.backward(out, g)

    async def backward_inline(out: Any) -> None:
        default = ag.autograd.get_engine()
        ag.autograd.set_engine(_inline_engine())
        try:
            await ag.backward(out, g)
        finally:
            ag.autograd.set_engine(default)

    def reset() -> None:
        for t in leaves:
            if not isinstance(t, np.ndarray):
                t.grad = None

    return forward, (backward, reset, backward_inline)


_INLINE: list[Any] = []


def _inline_engine() -> Any:
    """An engine that runs every node on the loop's thread: the kernels' own cost, without
    the hop to a worker thread that the default engine makes for large nodes."""
    if not _INLINE:
        from asyncgrad.autograd.engine import Engine

        _INLINE.append(Engine(inline_threshold=2**62))
    return _INLINE[0]


def _torch_impl(op: OpCase, arrays: list[np.ndarray], grad_seed: int) -> tuple[Callable[[], Any], Any]:
    import torch

    leaves = [torch.from_numpy(a.copy()).requires_grad_() if a.dtype.kind == "f" else a for a in arrays]
    out_shape = tuple(op.torch(*leaves).shape)
    g = torch.from_numpy(np.random.default_rng(grad_seed).standard_normal(out_shape).astype(np.float32))

    def forward() -> Any:
        return op.torch(*leaves)

    def backward(out: Any) -> None:
        out.backward(g)

    def reset() -> None:
        for t in leaves:
            if not isinstance(t, np.ndarray):
                t.grad = None

    return forward, (backward, reset, None)


async def _measure_op(op: OpCase, size: dict[str, int], impls: list[str], rounds: int) -> dict[str, list[float]]:
    """Seconds per call of forward and backward for each library, interleaved."""
    arrays = op.make(np.random.default_rng(0), size)
    builders = {ASYNCGRAD: _ag_impl, TORCH: _torch_impl}
    cases: list[tuple[str, str, Any]] = []
    for impl in impls:
        fwd, (bwd, reset, bwd_inline) = builders[impl](op, arrays, 1)
        cases.append((impl, "forward", (fwd, None, reset)))
        cases.append((impl, "backward", (fwd, bwd, reset)))
        if bwd_inline is not None:
            cases.append((impl, "backward inline", (fwd, bwd_inline, reset)))
    times: dict[str, list[float]] = {f"{i} {k}": [] for i, k, _ in cases}
    for r in range(rounds + 1):  # round 0 warms up
        k = r % len(cases)
        with no_gc():  # (once per round: see the module's docstring)
            for impl, kind, (fwd, bwd, reset) in cases[k:] + cases[:k]:
                reset()
                if bwd is None:
                    t0 = time.perf_counter()
                    out = fwd()
                    dt = time.perf_counter() - t0
                else:
                    out = fwd()
                    t0 = time.perf_counter()
                    res = bwd(out)
                    if asyncio.iscoroutine(res):
                        await res
                    dt = time.perf_counter() - t0
                del out
                if r:
                    times[f"{impl} {kind}"].append(dt)
    return times


def run(impls: list[str], rounds: int | None = None, sizes: tuple[str, ...] = ("small", "large"),
        only: tuple[str, ...] | None = None) -> Result:
    rounds = rounds or DEFAULT_ROUNDS
    impls = [i for i in impls if i in (ASYNCGRAD, TORCH)]
    res = Result(
        "ops", "forward and backward per op, float32; small = GPT of the transformer workload "
               "(B16 T64 C128 H4 V65), large = B32 T128 C256 H8 V512",
        {"rounds": rounds, "sizes": {k: SIZES[k] for k in sizes}, "dtype": "float32"},
        [Column("size", "size", "{}"),
         Column("ag_fwd_ms", "asyncgrad fwd ms", "{:.3f}"), Column("torch_fwd_ms", "torch fwd ms", "{:.3f}"),
         Column("fwd_ratio", "fwd x torch", "{:.2f}"),
         Column("ag_bwd_ms", "asyncgrad bwd ms", "{:.3f}"), Column("torch_bwd_ms", "torch bwd ms", "{:.3f}"),
         Column("bwd_ratio", "bwd x torch", "{:.2f}"),
         Column("ag_bwd_inline_ms", "asyncgrad bwd inline ms", "{:.3f}"),
         Column("bwd_inline_ratio", "bwd inline x torch", "{:.2f}")],
    )
    from asyncgrad.ops import kernels

    kernels.wait()  # the path measured is known: compiled if they load (ASYNCGRAD_KERNELS)
    t_start = time.perf_counter()
    ops = [op for op in _cases() + _recurrent_cases() if only is None or op.name in only]

    async def main() -> None:
        for size in sizes:
            for op in ops:
                t = await _measure_op(op, SIZES[size], impls, rounds)
                row: dict[str, Any] = {"impl": op.name, "size": size}
                for impl, prefix in ((ASYNCGRAD, "ag"), (TORCH, "torch")):
                    for kind, short in (("forward", "fwd"), ("backward", "bwd")):
                        key = f"{prefix}_{short}_ms"
                        row[key] = median(t[f"{impl} {kind}"]) * 1e3 if f"{impl} {kind}" in t else None
                        row[f"{key}_rounds"] = t.get(f"{impl} {kind}")
                inline = t.get(f"{ASYNCGRAD} backward inline")
                row["ag_bwd_inline_ms"] = median(inline) * 1e3 if inline else None
                row["ag_bwd_inline_ms_rounds"] = inline
                for kind in ("fwd", "bwd", "bwd_inline"):
                    a, b = row[f"ag_{kind}_ms"], row[f"torch_{kind[:3]}_ms"]
                    row[f"{kind}_ratio"] = a / b if a is not None and b else None
                res.rows.append(row)

    torch = None
    if TORCH in impls:
        import torch

        torch_threads = torch.get_num_threads()
        torch.set_num_threads(1)
    try:
        with BLAS.limited(1):  # (bench/common.py, BlasThreads: the engine's own choice is kept for later)
            asyncio.run(main())
    finally:
        if torch is not None:
            torch.set_num_threads(torch_threads)
    res.notes.append("one thread each: numpy's BLAS limited to 1, torch.set_num_threads(1)")
    res.notes.append(f"kernels: {kernels.status()}")
    res.seconds = time.perf_counter() - t_start
    ratios = [r[k] for r in res.rows for k in ("fwd_ratio", "bwd_ratio") if r.get(k) is not None]
    if ratios:
        worst = max(ratios)
        res.ratios["worst op x torch"] = worst
        res.targets.append(Target("no op above 2x torch (worst fwd or bwd ratio)", worst, 2.0, "x"))
    for label, prefixes, bound in LAYER_TARGETS:
        layer = [r[k] for r in res.rows if r["impl"].startswith(prefixes)
                 for k in ("fwd_ratio", "bwd_ratio") if r.get(k) is not None]
        if layer:
            res.targets.append(Target(f"issue 32: {label} within {bound:g}x torch (worst fwd or bwd ratio)",
                                      max(layer), bound, "x"))
    return res


# issue 32's bounds for the image and recurrent layers, on the rows whose names start so
LAYER_TARGETS = (
    ("conv2d, pooling and batch norm", ("conv2d", "max_pool2d", "avg_pool2d", "batch_norm"), 1.5),
    ("LSTM and GRU", ("LSTM", "GRU"), 2.0),
)

