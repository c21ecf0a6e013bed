"""Pictures of the backward graph: Graphviz DOT text, and SVG/PNG when Graphviz is there.

    dot = ag.viz.to_dot(loss, params=dict(model.named_parameters()))
    ag.viz.render(loss, "graph.svg", params=..., profile=prof)

Drawn as torchviz draws it: one box per backward node (its name and the shapes of the
inputs it computes gradients for), edges in the direction data flowed forward (from a
node's ``next_functions`` to the node), leaves (``AccumulateGrad``) in blue with their
parameter name when ``params`` (name -> tensor) is given, the output tensors in green.
``show_saved=True`` adds the tensors each node saved for backward (orange).
``profile=`` (an ``autograd.profiler.profile``) colours each node by the time its kernel
took, from white to red, and adds that time to its label.

``to_dot`` needs nothing beyond asyncgrad. ``render`` needs the Graphviz ``dot`` program
(``apt-get install graphviz`` / ``brew install graphviz``) and uses the ``graphviz``
Python package (``pip install graphviz``) when it is installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from typing import Any

from .autograd.graph import AccumulateGrad, Node, SavedTensor
from .tensor import Tensor

__all__ = ["GraphvizNotFoundError", "render", "to_dot"]

_INSTALL_HINT = (
    "Rendering the graph needs Graphviz: install the 'dot' program (Debian/Ubuntu: "
    "'apt-get install graphviz', macOS: 'brew install graphviz', conda: 'conda install "
    "graphviz') and the Python package ('pip install graphviz'). ag.viz.to_dot() works "
    "without them; paste its text into any Graphviz viewer."
)

_OUTPUT_COLOR = "darkolivegreen1"
_LEAF_COLOR = "lightblue"
_SAVED_COLOR = "orange"
_NODE_COLOR = "lightgrey"


class GraphvizNotFoundError(RuntimeError):
    """Raised by :func:`render` when Graphviz is not installed (the message says how)."""


def to_dot(tensor: Tensor | Iterable[Tensor], params: Mapping[str, Tensor] | None = None,
           show_saved: bool = False, profile: Any = None, *, name: str = "backward") -> str:
    """The backward graph of ``tensor`` (or of several output tensors) as DOT text."""
    outputs = [tensor] if isinstance(tensor, Tensor) else list(tensor)
    param_names = {id(t): n for n, t in (params or {}).items()}
    times = _node_times(profile) if profile is not None else {}
    slowest = max(times.values(), default=0)

    ids: dict[Node, str] = {}
    lines = [
        f"digraph {_quote(name)} {{",
        '  graph [rankdir=TB, fontname="Helvetica"];',
        '  node [shape=box, style="filled,rounded", fillcolor=lightgrey, fontname="Helvetica", fontsize=10];',
        '  edge [fontname="Helvetica", fontsize=9];',
    ]

    def node_id(node: Node) -> str:
        nid = ids.get(node)
        if nid is None:
            nid = ids[node] = f"n{len(ids)}"
        return nid

    roots: list[Node] = []
    for i, out in enumerate(outputs):
        oid = f"out{i}"
        label = f"output {i}" if len(outputs) > 1 else "output"
        lines.append(f"  {oid} [label={_quote(label + chr(10) + _fmt_shape(out.shape))}, "
                     f"fillcolor={_OUTPUT_COLOR}, shape=box];")
        grad_fn = out.grad_fn
        if grad_fn is None and out.requires_grad:  # a leaf: its AccumulateGrad node
            grad_fn = AccumulateGrad.for_leaf(out)
        if grad_fn is not None:
            lines.append(f"  {node_id(grad_fn)} -> {oid};")
            roots.append(grad_fn)

    seen: set[Node] = set()
    stack = list(reversed(roots))
    while stack:  # iterative walk: graphs can be deep
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        nid = node_id(node)
        lines.append(f"  {nid} [{_node_attrs(node, param_names, times, slowest)}];")
        if show_saved:
            for k, (label, shape) in enumerate(_saved(node)):
                sid = f"{nid}_s{k}"
                lines.append(f"  {sid} [label={_quote(label + chr(10) + _fmt_shape(shape))}, "
                             f"fillcolor={_SAVED_COLOR}, shape=box, style=filled];")
                lines.append(f"  {sid} -> {nid} [style=dashed, dir=none];")
        for child, _nr in node.next_edges:
            if child is None:
                continue
            lines.append(f"  {node_id(child)} -> {nid};")
            if child not in seen:
                stack.append(child)
    lines.append("}")
    return "\n".join(lines) + "\n"


def render(tensor: Tensor | Iterable[Tensor], path: str | os.PathLike[str], format: str | None = None,
           params: Mapping[str, Tensor] | None = None, show_saved: bool = False, profile: Any = None,
           dpi: int | None = None) -> str:
    """Draw the backward graph of ``tensor`` into ``path`` (``format`` "svg", "png", "pdf",
    ...; by default from the file's suffix). Returns the path written.

    Raises :class:`GraphvizNotFoundError`, saying how to install Graphviz, when the
    ``dot`` program cannot be found."""
    path = os.fspath(path)
    fmt = format or os.path.splitext(path)[1].lstrip(".").lower() or "svg"
    dot = to_dot(tensor, params=params, show_saved=show_saved, profile=profile)
    if dpi is not None:
        dot = dot.replace("  graph [rankdir=TB,", f"  graph [rankdir=TB, dpi={int(dpi)},", 1)
    data = _run_dot(dot, fmt)
    with open(path, "wb") as f:
        f.write(data)
    return path


def _run_dot(dot: str, fmt: str) -> bytes:
    try:
        import graphviz
    except ImportError:
        graphviz = None
    if graphviz is not None:
        try:
            return graphviz.Source(dot).pipe(format=fmt)  # type: ignore[no-any-return]
        except graphviz.ExecutableNotFound as e:
            raise GraphvizNotFoundError(_INSTALL_HINT) from e
    exe = shutil.which("dot")
    if exe is None:
        raise GraphvizNotFoundError(_INSTALL_HINT)
    done = subprocess.run([exe, f"-T{fmt}"], input=dot.encode(), capture_output=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"dot failed: {done.stderr.decode(errors='replace').strip()}")
    return done.stdout


# --------------------------------------------------------------------------------------
# Labels
# --------------------------------------------------------------------------------------

def _node_attrs(node: Node, param_names: dict[int, str], times: dict[int, int], slowest: int) -> str:
    if isinstance(node, AccumulateGrad):
        var = node.variable
        pname = param_names.get(id(var))
        label = (pname + "\n" if pname else "") + _fmt_shape(var.shape)
        return f"label={_quote(label)}, fillcolor={_LEAF_COLOR}"
    shapes = [s for s in getattr(node, "input_shapes", ()) if s is not None]
    label = node.name()
    if shapes:
        label += "\n" + ", ".join(_fmt_shape(s) for s in shapes)
    color = _NODE_COLOR
    ns = times.get(node.sequence_nr)
    if ns is not None:
        label += f"\n{_fmt_ms(ns)}"
        color = _heat(ns / slowest if slowest else 0.0)
    return f"label={_quote(label)}, fillcolor={_quote(color)}"


def _saved(node: Node) -> list[tuple[str, tuple[int, ...] | None]]:
    """The tensors a built-in node saved: its ``checks`` (the SavedTensors behind the
    rule arguments ``(ans, x, y, ...)``, each with its position); constants are left out.
    A tensor saved through ``saved_tensors_hooks`` has no shape here."""
    if not hasattr(node, "saved_entries"):
        return []
    out = []
    for pos, entry in sorted(node.saved_entries(), key=lambda pe: pe[0]):
        shape = getattr(entry.data, "shape", None) if type(entry) is SavedTensor else None
        out.append(("saved result" if pos == 0 else f"saved input {pos - 1}", shape))
    return out


def _node_times(profile: Any) -> dict[int, int]:
    """Total kernel time per node, keyed by ``sequence_nr`` (unique per node; events keep no
    reference to the graph, and AccumulateGrad nodes are never profiled)."""
    times: dict[int, int] = {}
    for e in profile.events:
        times[e.sequence_nr] = times.get(e.sequence_nr, 0) + e.duration_ns
    return times


def _heat(frac: float) -> str:
    """White (0) to red (1), as an RGB colour."""
    frac = min(max(frac, 0.0), 1.0)
    other = int(round(255 * (1 - 0.85 * frac)))
    return f"#ff{other:02x}{other:02x}"


def _fmt_shape(shape: Any) -> str:
    if shape is None:
        return "?"
    return "(" + ", ".join(str(d) for d in shape) + ")"


def _fmt_ms(ns: int) -> str:
    return f"{ns / 1e6:.3f} ms" if ns >= 1e5 else f"{ns / 1e3:.1f} us"


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
