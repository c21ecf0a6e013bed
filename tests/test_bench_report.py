"""The benchmarks page is generated from one run: ``bench.report`` renders any workload of a
run's JSON from what the workload declares, and docs/benchmarks.md is exactly what it
renders from docs/benchmarks.json (so the page cannot drift from its run)."""

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import About, about_of  # noqa: E402
from bench.plot import panels  # noqa: E402
from bench.report import render  # noqa: E402


def _workload(name, about=None, **extra):
    w = {"name": name, "description": f"{name} of this run", "params": {},
         "columns": [{"key": "ms", "label": "backward ms", "fmt": "{:.1f}"},
                     {"key": "speedup", "label": "speed-up", "fmt": "{:.2f}"}],
         "rows": [{"impl": "asyncgrad", "ms": 12.34, "speedup": None}, {"impl": "torch", "ms": 10.0, "speedup": 1.5}],
         "ratios": {"asyncgrad/torch": 1.234}, "targets": [], "notes": ["BLAS threads: 2"], "seconds": 1.0, **extra}
    if about is not None:
        w["about"] = about
    return w


def _payload(*workloads):
    return {"command": "python -m bench --only x", "total_seconds": 12.0, "impls": ["asyncgrad", "torch"],
            "machine": {"date_utc": "2026-01-01 00:00:00", "nproc": 2, "cpu_model": "CPU", "loadavg_start": [0.5],
                        "python": "3.11", "numpy": "2.0", "torch": "2.13.0", "autograd": None,
                        "asyncgrad": "0.1.0", "asyncgrad_src_sha256": "abc", "numpy_blas": {"name": "openblas",
                                                                                            "version": "0.3"}},
            "workloads": list(workloads)}


def test_a_new_workload_renders_from_its_declaration_alone():
    about = About(title="Scaling of concurrent backward calls", measures="K tasks at once.",
                  reading="Higher is better.", plots=(("ms", "backward ms", False),)).as_dict()
    page = render(_payload(_workload("scaling", about)))
    assert "### Scaling of concurrent backward calls" in page
    assert "K tasks at once." in page and "**How to read it.** Higher is better." in page
    assert "Run it alone: `python -m bench --only scaling`" in page
    assert "| implementation | backward ms | speed-up |" in page
    assert "| **asyncgrad** | 12.3 | — |" in page and "| torch | 10.0 | 1.50 |" in page
    assert "* asyncgrad / torch: **1.23**" in page and "* BLAS threads: 2" in page
    assert "![Scaling of concurrent backward calls](img/bench_scaling.png)" in page
    assert "* [Scaling of concurrent backward calls](#scaling-of-concurrent-backward-calls)" in page
    # a user's page: no development targets or issue numbers
    assert "target" not in page.lower() and "issue" not in page.lower()


def test_a_workload_without_declaration_falls_back_to_its_description():
    page = render(_payload(_workload("not_a_module_here")))
    assert "### not\\_a\\_module\\_here of this run" in page or "### not_a_module_here of this run" in page
    assert "| **asyncgrad** | 12.3 | — |" in page


def test_about_of_reads_a_module_docstring_without_about():
    module = types.ModuleType("bench.workloads.opt")
    module.__doc__ = "op_table: every op's forward and backward.\n\nOne row per op,\nagainst PyTorch.\n"
    about = about_of(module, "op_table")
    assert about["title"] == "every op's forward and backward"
    assert about["measures"] == "One row per op, against PyTorch."
    module.ABOUT = About(title="T", measures="M")
    assert about_of(module, "op_table")["title"] == "T"


def test_plot_panels_are_declared_or_the_first_column():
    assert panels(_workload("x", {"plots": [["speedup", "speed-up", True]]})) == [("speedup", "speed-up", True)]
    assert panels(_workload("x")) == [("ms", "backward ms", False)]


def test_every_shipped_workload_declares_what_the_page_needs():
    from bench.run import WORKLOADS

    for name in WORKLOADS:
        module = __import__(f"bench.workloads.{name}", fromlist=["ABOUT"])
        about = module.ABOUT
        assert about.title and about.measures and about.reading, name
        assert about.plots, name


def test_the_docs_page_is_the_rendering_of_its_run():
    run = json.loads((ROOT / "docs" / "benchmarks.json").read_text())
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    assert page == render(run), "docs/benchmarks.md is stale: python -m bench.report docs/benchmarks.json " \
                                "-o docs/benchmarks.md"
    for w in run["workloads"]:
        assert (ROOT / "docs" / "img" / f"bench_{w['name']}.png").exists(), w["name"]


def test_report_cli_refuses_a_json_without_workloads(tmp_path):
    bad = tmp_path / "run.json"
    bad.write_text(json.dumps({"workloads": []}))
    proc = subprocess.run([sys.executable, "-m", "bench.report", str(bad)], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and "holds no workloads" in proc.stderr


@pytest.mark.parametrize("figures", [None, "pics"])
def test_report_cli_writes_the_page(tmp_path, figures):
    run = tmp_path / "run.json"
    run.write_text(json.dumps(_payload(_workload("scaling", {"title": "S", "measures": "M"}))))
    args = [sys.executable, "-m", "bench.report", str(run), "-o", str(tmp_path / "page.md")]
    if figures:
        args += ["--figures", figures]
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    page = (tmp_path / "page.md").read_text()
    assert page.startswith("# Benchmarks") and "### S" in page
    assert (f"({figures}/bench_scaling.png)" in page) if figures else ("img/bench_scaling.png" in page)


def test_a_run_on_a_loaded_machine_says_so():
    busy = _payload(_workload("scaling", {"title": "S", "measures": "M"}))
    busy["machine"]["loadavg_start"] = [3.5]
    assert "Other work shared the machine during this run" in render(busy)
    assert "load average was 3.50 on 2 cores" in render(busy)
    assert "Other work shared the machine" not in render(_payload(_workload("scaling", {"title": "S"})))


def test_the_runner_records_each_workloads_about_in_the_run():
    from bench.run import run_workload

    r = run_workload("chain", ["asyncgrad", "numpy"], rounds=1, n=8, size=2)
    about = r.as_dict()["about"]
    assert about["title"] == "Many tiny operations: the cost per node"
    assert about["plots"][0][0] == "backward_us_per_node"
    assert "### Many tiny operations: the cost per node" in render(_payload(r.as_dict()))


def test_the_page_says_which_blas_kernels_ran_and_warns_when_the_environment_forced_them():
    from bench import blas_kernels

    run = _payload(_workload("scaling", {"title": "S", "measures": "M"}))
    run["machine"]["threadpools"] = [
        {"user_api": "blas", "internal_api": "openblas", "prefix": "libscipy_openblas", "version": "0.3.31",
         "architecture": "Haswell", "num_threads": 2},
        {"user_api": "openmp", "internal_api": "openmp", "prefix": "libgomp", "version": None,
         "architecture": None, "num_threads": 2}]
    run["machine"]["blas_env"] = {"OPENBLAS_CORETYPE": "Haswell", "OPENBLAS_L2_SIZE": "512"}
    page = render(run)
    assert ("* **BLAS kernels that ran (threadpoolctl)**: openblas 0.3.31 (libscipy_openblas), architecture Haswell, "
            "2 threads\n") in page
    assert "* **BLAS environment**: `OPENBLAS_CORETYPE=Haswell`, `OPENBLAS_L2_SIZE=512` (**forced**" in page
    assert '!!! danger "This run measured BLAS kernels that users do not get"' in page
    assert "OPENBLAS_CORETYPE=Haswell, OPENBLAS_L2_SIZE=512 was set in this run's environment" in page
    assert "`env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python -m bench ...`" in page
    assert page.index("This run measured BLAS kernels") < page.index("## Results")
    # the same console lines from the runner
    lines = blas_kernels.header(run["machine"])
    assert lines[0] == "# BLAS: openblas 0.3.31 (libscipy_openblas), architecture Haswell, 2 threads"
    assert any(line.startswith("# WARNING: OPENBLAS_CORETYPE=Haswell") for line in lines)

    run["machine"]["blas_env"] = {}
    quiet = render(run)
    assert "This run measured BLAS kernels" not in quiet and not any("WARNING" in x
                                                                      for x in blas_kernels.header(run["machine"]))
    assert "neither OPENBLAS_CORETYPE nor OPENBLAS_L2_SIZE set" in quiet
    del run["machine"]["blas_env"], run["machine"]["threadpools"]
    old = render(run)  # a run from before these fields: said, not guessed
    assert "* **BLAS environment**: not recorded in this run" in old
    assert "* **BLAS kernels that ran (threadpoolctl)**: not recorded" in old


def test_the_runner_records_the_kernel_forcing_variables_and_every_pool(monkeypatch):
    from bench import blas_kernels
    from bench.run import machine_info

    assert blas_kernels.kernel_env({"OPENBLAS_CORETYPE": "Haswell", "PATH": "/bin"}) == {"OPENBLAS_CORETYPE": "Haswell"}
    assert blas_kernels.kernel_env({}) == {}
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Zen")
    monkeypatch.delenv("OPENBLAS_L2_SIZE", raising=False)
    machine = machine_info()
    assert machine["blas_env"] == {"OPENBLAS_CORETYPE": "Zen"}
    pools = machine["threadpools"]
    assert isinstance(pools, list) and any(p["user_api"] == "blas" for p in pools)  # numpy's BLAS is loaded
    assert set(pools[0]) == set(blas_kernels.POOL_KEYS)
    assert "OPENBLAS_CORETYPE=Zen" in (blas_kernels.warning(machine) or "")


def test_the_docs_say_how_to_run_the_benchmarks_on_the_kernels_users_get():
    command = "env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python -m bench"
    assert command in (ROOT / "README.md").read_text().replace("\n  ", " ")
    assert command in (ROOT / "docs" / "benchmarks.md").read_text()
    assert command in (ROOT / "bench" / "run.py").read_text()
