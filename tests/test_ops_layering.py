"""ops never import autograd (issue 30): every module under ``src/asyncgrad/ops/``, read
with ``ast``, imports, at module level or inside a function, nothing of
``asyncgrad.autograd``; what the intra-op switch needs from the engine's BLAS policy the
engine registers (``intra_op.use_gate``)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import asyncgrad  # noqa: F401 - the engine registers its gate at import
from asyncgrad.autograd.policy import BLAS
from asyncgrad.ops.kernels import intra_op

SRC = Path(__file__).resolve().parent.parent / "src"
OPS = SRC / "asyncgrad" / "ops"
FORBIDDEN = "asyncgrad.autograd"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(source: str, module: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in ``source``, the text of ``module``,
    nested ones included: ``import a.b``, ``from .x import y`` (resolved against the
    module's package, with ``x.y`` as a possible submodule) and
    ``importlib.import_module("...")`` / ``__import__("...")`` with a literal name."""
    package = module if is_package else module.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            found.append((node.lineno, name))
            found += [(node.lineno, f"{name}.{alias.name}") for alias in node.names]
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and getattr(node.func, "attr", getattr(node.func, "id", None)) in ("import_module", "__import__")):
            found.append((node.lineno, node.args[0].value))
    return found


def _imports_autograd(module: str) -> bool:
    return module == FORBIDDEN or module.startswith(FORBIDDEN + ".")


@pytest.mark.parametrize(("source", "expected"), [
    ("def f():\n    from ...autograd.policy import BLAS\n", "asyncgrad.autograd.policy"),  # nested
    ("from ... import autograd\n", "asyncgrad.autograd"),
    ("import asyncgrad.autograd.engine as e\n", "asyncgrad.autograd.engine"),
    ("import importlib\nimportlib.import_module('asyncgrad.autograd')\n", "asyncgrad.autograd"),
])
def test_the_walk_sees_relative_nested_and_dynamic_imports(source: str, expected: str) -> None:
    found = [name for _, name in imported_modules(source, "asyncgrad.ops.kernels.probe")]
    assert expected in found and any(_imports_autograd(name) for name in found)
    assert not any(_imports_autograd(n) for _, n in imported_modules("from ..kernels import loader\n",
                                                                     "asyncgrad.ops.kernels.probe"))


@pytest.mark.parametrize("path", sorted(OPS.rglob("*.py")), ids=lambda p: str(p.relative_to(OPS)))
def test_no_ops_module_imports_autograd(path: Path) -> None:
    found = imported_modules(path.read_text(), _module_name(path), path.name == "__init__.py")
    bad = [f"{path.relative_to(SRC)}:{line} imports {module}" for line, module in found if _imports_autograd(module)]
    assert not bad, bad


def test_the_engine_registers_its_blas_policy_as_the_intra_op_gate() -> None:
    assert intra_op._gate is BLAS


def test_without_a_gate_every_kernel_stays_serial(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(intra_op, "available", True)
    monkeypatch.setattr(intra_op, "_enabled", True)
    launches = intra_op.launches
    monkeypatch.setattr(intra_op, "_gate", None)
    assert not intra_op.allowed()

    class Idle:
        def intra_op_ok(self, one_pool: bool = False) -> bool:
            return True

        def pinned(self, n: int):  # type: ignore[no-untyped-def]
            raise AssertionError("not in one pool")

    intra_op.use_gate(Idle())
    assert intra_op.allowed() and intra_op.launches == launches + 1
