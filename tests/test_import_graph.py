"""The import graph of ``asyncgrad`` (every ``import`` the code runs: at the top of a
module and inside functions; not those under ``if TYPE_CHECKING:``, which never run),
and the layering rules it must keep (STYLE.md, issue 30):

* ops never import autograd;
* the graph layer (``autograd/graph/``) never imports the engine's layers above it;
* the runtime layer (``autograd/runtime/``) knows no graph, no task and no scheduler;
* no cycle beyond the ones listed in ``ALLOWED_CYCLES``, each with its reason.

Run as a script (``python tests/test_import_graph.py``) it prints the graph's cycles.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "asyncgrad"


def _modules() -> dict[str, tuple[Path, bool]]:
    found = {}
    for path in sorted((SRC / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        found[".".join(parts)] = (path, is_package)
    return found


def _runtime_imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement outside ``if TYPE_CHECKING:`` blocks."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def import_graph() -> dict[str, set[str]]:
    """Module -> the asyncgrad modules it imports (a ``from pkg import name`` of a
    submodule counts as importing the submodule)."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, (path, is_package) in modules.items():
        here = name if is_package else name.rpartition(".")[0]
        for node in _runtime_imports(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                if node.level:
                    base = here.split(".")
                    base = base[: len(base) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                submodules = [f"{target}.{alias.name}" for alias in node.names if f"{target}.{alias.name}" in modules]
                # ``from pkg import submodule`` imports the submodule (the package is
                # the importer's own ancestor, initialised first); a name from it, the package
                targets = submodules if len(submodules) == len(node.names) else [target, *submodules]
            for target in targets:
                while target and target not in modules:  # ``import a.b.c`` of a name inside
                    target = target.rpartition(".")[0]
                if target and target != name and target.startswith(PACKAGE):
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative),
    each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


# Each allowed cycle, and why it stays: none. Tensor itself is in no cycle: the package
# hands it the modules its methods delegate to (``tensor.bind_functional``), and the graph
# layer gets the Tensor class and the create_graph math by registration (Note [The graph
# layer never imports Tensor]); inside the functional package ``index_select`` of a 0-d
# tensor reshapes through Tensor's method, not by importing shape.py.
ALLOWED_CYCLES: list[tuple[set[str], str]] = []
# Layering exceptions still to remove, each with where that happens.
KNOWN_LAYER_EXCEPTIONS: dict[str, str] = {}


def _layer_violations(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for module, targets in graph.items():
        for target in targets:
            if module.startswith("asyncgrad.ops") and target.startswith("asyncgrad.autograd"):
                bad.append(f"{module} -> {target} (ops never import autograd)")
            if module.startswith("asyncgrad.autograd.graph") and target.startswith(
                    ("asyncgrad.autograd.task", "asyncgrad.autograd.sched", "asyncgrad.autograd.engine",
                     "asyncgrad.autograd.api")):
                bad.append(f"{module} -> {target} (the graph layer never imports the engine's)")
            if module.startswith("asyncgrad.autograd.runtime") and target.startswith(
                    ("asyncgrad.autograd.graph", "asyncgrad.autograd.task", "asyncgrad.autograd.sched",
                     "asyncgrad.autograd.engine", "asyncgrad.tensor")):
                bad.append(f"{module} -> {target} (the runtime knows no graph)")
    return sorted(bad)


def test_the_import_graph_finds_every_kind_of_import():
    graph = import_graph()
    assert "asyncgrad.autograd.engine" in graph["asyncgrad.autograd.api"]  # top level
    assert "asyncgrad.autograd.tools.anomaly_mode" in graph["asyncgrad.autograd.graph.record"]  # (in-function)
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle_beyond_the_allowed_ones():
    allowed = [members for members, _ in ALLOWED_CYCLES]
    unexpected = [c for c in cycles(import_graph()) if set(c) not in allowed]
    assert not unexpected, "\n".join(" <-> ".join(c) for c in unexpected)


def test_the_layers_import_only_downwards():
    assert [v for v in _layer_violations(import_graph()) if v not in KNOWN_LAYER_EXCEPTIONS] == []


def test_the_engine_core_is_in_no_import_cycle():
    """api, engine and the task, sched and runtime layers import only downwards: no
    cycle reaches them, counting in-function imports."""
    core = ("asyncgrad.autograd.api", "asyncgrad.autograd.engine", "asyncgrad.autograd.task",
            "asyncgrad.autograd.sched", "asyncgrad.autograd.runtime")
    assert [m for c in cycles(import_graph()) for m in c if m.startswith(core)] == []


def test_tensor_and_the_graph_layer_are_in_no_import_cycle():
    """``tensor.py``, the graph layer and the forward modules around them import only
    downwards: the graph layer gets the Tensor class and the create_graph math by
    registration (Note [The graph layer never imports Tensor]), and ``tensor.py`` is
    handed the modules its methods delegate to."""
    forward = ("asyncgrad.tensor", "asyncgrad.autograd.graph", "asyncgrad._tensor_math", "asyncgrad.creation",
               "asyncgrad.sampling", "asyncgrad.torch_ops", "asyncgrad.return_types",
               "asyncgrad.autograd.tools.anomaly_mode")
    assert [m for c in cycles(import_graph()) for m in c if m.startswith(forward)] == []


if __name__ == "__main__":
    g = import_graph()
    for c in cycles(g):
        print(len(c), "modules:", " ".join(m.replace("asyncgrad.", "") for m in c))
    for line in _layer_violations(g):
        print(line)
    sys.exit(0)
