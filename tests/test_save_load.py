"""ag.save / ag.load: state dicts and nested containers round trip; weights-only loading
refuses other types; files written by torch.save load; ag.cuda says there is no GPU."""

import io
import pickle
from collections import OrderedDict

import numpy as np
import pytest

import asyncgrad as ag


def test_model_and_optimizer_round_trip_through_a_path(tmp_path):
    model = ag.nn.Sequential(ag.nn.Linear(3, 4), ag.nn.ReLU(), ag.nn.Linear(4, 2))
    opt = ag.optim.Adam(model.parameters(), lr=1e-3)
    model(ag.randn(5, 3)).sum().backward()
    opt.step()
    path = tmp_path / "ckpt.pt"
    ag.save({"model": model.state_dict(), "opt": opt.state_dict(), "epoch": 3}, path)
    ckpt = ag.load(path)
    assert isinstance(ckpt["model"], OrderedDict) and list(ckpt["model"]) == list(model.state_dict())
    fresh = ag.nn.Sequential(ag.nn.Linear(3, 4), ag.nn.ReLU(), ag.nn.Linear(4, 2))
    fresh.load_state_dict(ckpt["model"])
    for p, q in zip(model.parameters(), fresh.parameters()):
        np.testing.assert_array_equal(p.numpy(), q.numpy())
    opt2 = ag.optim.Adam(fresh.parameters(), lr=1e-3)
    opt2.load_state_dict(ckpt["opt"])
    assert ckpt["epoch"] == 3 and opt2.state_dict()["param_groups"] == opt.state_dict()["param_groups"]


def test_nested_values_keep_their_types_through_a_file_object():
    x = ag.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2  # a non-leaf: saved as its data, detached
    obj = {"t": x, "y": y, "a": np.arange(3, dtype=np.int32), "n": [1, 2.5, None, True, "s", (3, b"b")],
           "s": np.float32(1.5), "nested": {"deep": [ag.zeros(2, 2)]}}
    buf = io.BytesIO()
    ag.save(obj, buf)
    buf.seek(0)
    out = ag.load(buf)
    assert isinstance(out["t"], ag.Tensor) and out["t"].requires_grad and out["t"].is_leaf
    assert out["y"].is_leaf and not out["y"].requires_grad and out["y"].tolist() == [2.0, 4.0]
    assert out["a"].dtype == np.int32 and out["a"].tolist() == [0, 1, 2]
    assert out["n"] == [1, 2.5, None, True, "s", (3, b"b")] and out["s"] == np.float32(1.5)
    assert out["nested"]["deep"][0].shape == (2, 2)


class _Payload:
    def __reduce__(self):
        return (print, ("this must not run",))


def test_weights_only_refuses_other_types_and_weights_only_false_allows_them(capsys):
    buf = io.BytesIO()
    ag.save({"x": _Payload()}, buf)
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed: builtins.print is not an allowed"):
        ag.load(io.BytesIO(buf.getvalue()))
    assert capsys.readouterr().out == ""
    ag.load(io.BytesIO(buf.getvalue()), weights_only=False)
    assert "this must not run" in capsys.readouterr().out


def test_map_location_other_than_cpu_is_refused():
    buf = io.BytesIO()
    ag.save({"x": 1}, buf)
    assert ag.load(io.BytesIO(buf.getvalue()), map_location="cpu") == {"x": 1}
    with pytest.raises(RuntimeError, match="CPU only"):
        ag.load(io.BytesIO(buf.getvalue()), map_location="cuda:0")


def test_torch_checkpoint_loads_into_the_asyncgrad_model():
    torch = pytest.importorskip("torch")
    theirs = torch.nn.LSTM(3, 4, num_layers=2, bidirectional=True).double()
    buf = io.BytesIO()
    view = torch.arange(12.0).reshape(3, 4).t()  # a strided view of a shared storage
    torch.save({"model": theirs.state_dict(), "view": view, "ints": torch.arange(3), "step": 5}, buf)
    ckpt = ag.load(io.BytesIO(buf.getvalue()))
    mine = ag.nn.LSTM(3, 4, num_layers=2, bidirectional=True)
    mine.load_state_dict(ckpt["model"])
    for p, q in zip(theirs.parameters(), mine.parameters()):
        np.testing.assert_array_equal(q.numpy(), p.detach().numpy())
    np.testing.assert_array_equal(ckpt["view"].numpy(), view.numpy())
    assert ckpt["ints"].dtype == np.int64 and ckpt["step"] == 5


def test_cuda_is_not_available():
    assert ag.cuda.is_available() is False and ag.cuda.device_count() == 0
    ag.cuda.manual_seed_all(0)  # a no-op, as PyTorch's without a GPU
