"""Graph pictures: ``ag.viz.to_dot`` and ``ag.viz.render``."""

import re
import shutil
import subprocess
import sys

import pytest

import asyncgrad as ag
from asyncgrad.autograd.graph import iter_graph

NODE_RE = re.compile(r'^\s+(\w+) \[label="((?:[^"\\]|\\.)*)"(.*)\];$', re.M)
EDGE_RE = re.compile(r"^\s+(\w+) -> (\w+)( \[.*\])?;$", re.M)

HAS_DOT = shutil.which("dot") is not None


def _mlp():
    x = ag.randn(8, 4)
    params = {
        "fc1.weight": ag.randn(4, 5, requires_grad=True),
        "fc1.bias": ag.randn(5, requires_grad=True),
        "fc2.weight": ag.randn(5, 3, requires_grad=True),
        "fc2.bias": ag.randn(3, requires_grad=True),
    }
    h = (x @ params["fc1.weight"] + params["fc1.bias"]).relu()
    out = h @ params["fc2.weight"] + params["fc2.bias"]
    loss = (out ** 2).mean()
    return loss, params


def _parse(dot):
    nodes = {m.group(1): (m.group(2), m.group(3)) for m in NODE_RE.finditer(dot)}
    edges = [(m.group(1), m.group(2), m.group(3) or "") for m in EDGE_RE.finditer(dot)]
    return nodes, edges


def test_mlp_dot_structure():
    loss, params = _mlp()
    dot = ag.viz.to_dot(loss, params=params)
    assert dot.startswith('digraph "backward" {') and dot.rstrip().endswith("}")
    nodes, edges = _parse(dot)
    graph = list(iter_graph(loss.grad_fn))
    # 7 backward nodes + 4 AccumulateGrad leaves + the output
    assert len(graph) == 11 and len(nodes) == 12
    assert len(edges) == sum(c is not None for n in graph for c, _ in n.next_edges) + 1 == 11
    # every edge joins declared nodes, and nothing is declared twice
    assert all(a in nodes and b in nodes for a, b, _ in edges)
    assert len(NODE_RE.findall(dot)) == len(nodes)
    labels = sorted(label.split("\\n")[0] for label, _ in nodes.values())
    assert labels == sorted(["output", "MeanBackward0", "PowBackward0", "AddBackward0", "AddBackward0",
                             "MmBackward0", "MmBackward0", "ReluBackward0",
                             "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"])
    by_label = {label: (nid, attrs) for nid, (label, attrs) in nodes.items()}
    # leaves: blue, named, with their shape; they feed their consumer
    nid, attrs = by_label["fc1.weight\\n(4, 5)"]
    assert "lightblue" in attrs
    (consumer,) = [b for a, b, _ in edges if a == nid]
    assert nodes[consumer][0] == "MmBackward0\\n(4, 5)"  # x needs no grad: one input shape
    assert by_label["fc2.bias\\n(3)"]
    # the output is fed by the loss's grad_fn
    out_id = by_label["output\\n()"][0]
    assert [nodes[a][0].split("\\n")[0] for a, b, _ in edges if b == out_id] == ["MeanBackward0"]
    # shapes of the inputs a node computes gradients for
    assert "AddBackward0\\n(8, 3), (3)" in by_label


def test_leaves_without_params_show_shapes_only_and_diamonds_appear_once():
    x = ag.randn(3, requires_grad=True)
    y = x.exp()
    z = (y * y + y).sum()  # y used three times
    nodes, edges = _parse(ag.viz.to_dot(z))
    graph = list(iter_graph(z.grad_fn))
    assert len(nodes) == len(graph) + 1
    assert sum(label.startswith("ExpBackward0") for label, _ in nodes.values()) == 1
    assert sum(label == "(3)" for label, _ in nodes.values()) == 1
    assert len(edges) == sum(c is not None for n in graph for c, _ in n.next_edges) + 1


def test_show_saved_adds_saved_tensors():
    loss, params = _mlp()
    plain, _ = _parse(ag.viz.to_dot(loss, params=params))
    nodes, edges = _parse(ag.viz.to_dot(loss, params=params, show_saved=True))
    saved = {nid: label for nid, (label, attrs) in nodes.items() if "orange" in attrs}
    assert len(nodes) == len(plain) + len(saved) and saved
    dashed = [(a, b) for a, b, attrs in edges if "dashed" in attrs]
    assert len(dashed) == len(saved) and {a for a, _ in dashed} == set(saved)
    relu = next(nid for nid, (label, _) in nodes.items() if label.startswith("ReluBackward0"))
    assert [saved[a] for a, b in dashed if b == relu] == ["saved result\\n(8, 5)"]


def test_several_outputs_and_a_leaf_output():
    x = ag.randn(2, requires_grad=True)
    a, b = x.sin(), x.cos()
    nodes, edges = _parse(ag.viz.to_dot([a, b]))
    labels = sorted(label for label, _ in nodes.values())
    assert labels == ["(2)", "CosBackward0\\n(2)", "SinBackward0\\n(2)", "output 0\\n(2)", "output 1\\n(2)"]
    assert len(edges) == 4
    nodes, edges = _parse(ag.viz.to_dot(x, params={"x": x}))
    assert sorted(label for label, _ in nodes.values()) == ["output\\n(2)", "x\\n(2)"] and len(edges) == 1


def test_deep_graph_needs_no_recursion():
    x = ag.randn(2, requires_grad=True)
    y = x
    for _ in range(3000):
        y = y * 1.0
    nodes, edges = _parse(ag.viz.to_dot(y.sum()))
    assert len(nodes) == 3000 + 3 and len(edges) == 3000 + 2


def test_labels_are_escaped():
    x = ag.randn(2, requires_grad=True)
    dot = ag.viz.to_dot(x.exp().sum(), params={'w"\\odd': x})
    assert '"w\\"\\\\odd\\n(2)"' in dot


async def test_profile_colours_nodes_by_time():
    loss, params = _mlp()
    with ag.autograd.profiler.profile() as prof:
        await ag.backward(loss, retain_graph=True)
    nodes, _ = _parse(ag.viz.to_dot(loss, params=params, profile=prof))
    timed = [(label, attrs) for label, attrs in nodes.values() if re.search(r"\\n[\d.]+ (us|ms)$", label)]
    assert len(timed) == len(prof.events) == 7
    colours = [re.search(r'fillcolor="(#[0-9a-f]{6})"', attrs).group(1) for _, attrs in timed]
    assert "#ff2626" in colours  # the slowest node is the reddest
    assert all(c.startswith("#ff") for c in colours)


@pytest.mark.skipif(not HAS_DOT, reason="Graphviz 'dot' is not installed")
def test_dot_output_parses_with_graphviz():
    loss, params = _mlp()
    dot = ag.viz.to_dot(loss, params=params, show_saved=True)
    done = subprocess.run(["dot", "-Tcanon"], input=dot.encode(), capture_output=True, check=False)
    assert done.returncode == 0, done.stderr.decode()


@pytest.mark.skipif(not HAS_DOT, reason="Graphviz 'dot' is not installed")
@pytest.mark.parametrize("fmt", ["svg", "png"])
def test_render_writes_svg_and_png(tmp_path, fmt):
    loss, params = _mlp()
    path = tmp_path / f"g.{fmt}"
    assert ag.viz.render(loss, path, params=params) == str(path)
    data = path.read_bytes()
    if fmt == "svg":
        assert b"<svg" in data and b"fc1.weight" in data
    else:
        assert data.startswith(b"\x89PNG\r\n\x1a\n")


def test_render_without_graphviz_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "graphviz", None)  # import graphviz -> ImportError
    monkeypatch.setattr(shutil, "which", lambda name: None)
    x = ag.randn(2, requires_grad=True)
    with pytest.raises(ag.viz.GraphvizNotFoundError) as info:
        ag.viz.render(x.exp().sum(), tmp_path / "g.svg")
    message = str(info.value)
    assert "pip install graphviz" in message and "apt-get install graphviz" in message
    assert isinstance(info.value, RuntimeError)
    assert not (tmp_path / "g.svg").exists()


@pytest.mark.skipif(not HAS_DOT, reason="Graphviz 'dot' is not installed")
def test_render_calls_dot_directly_without_the_python_package(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "graphviz", None)
    x = ag.randn(2, requires_grad=True)
    path = ag.viz.render(x.exp().sum(), tmp_path / "g.svg", params={"x": x})
    assert b"ExpBackward0" in (tmp_path / "g.svg").read_bytes() and path.endswith("g.svg")
