"""``Optimizer``: parameter groups, per-parameter state, ``zero_grad`` and ``state_dict``.

Subclasses implement ``step()`` as PyTorch's single-tensor ("for-loop") algorithms, in
numpy, writing each parameter's array in place and bumping its version counter once (so
a backward that still holds the old values raises instead of using the new ones).

Concurrency: ``step()`` is synchronous and runs to completion without yielding to the
event loop, and ``step()`` and ``zero_grad()`` hold the engine's commit lock
(``autograd.commit.grad_lock``), so neither sees nor makes a half-committed ``.grad``,
also when backward calls commit from other threads (Note [Atomic commits] in
autograd/commit.py).
Run it when the backward calls whose gradients it should use have returned, and not
while another backward that reads the parameters is still running.
"""

from __future__ import annotations

import copy
import functools
import warnings
from typing import Any
from collections.abc import Callable, Iterable

import numpy as np

from ..autograd.commit import grad_lock
from ..tensor import Tensor


class _Required:
    def __repr__(self) -> str:
        return "<required parameter>"


required: Any = _Required()


class Optimizer:
    """Base class: ``Optimizer(params, defaults)``, ``params`` being an iterable of tensors
    or of dicts (parameter groups with their own hyper-parameters)."""

    def __init__(self, params: Iterable[Any], defaults: dict[str, Any]) -> None:
        self.defaults = defaults
        self.state: dict[Tensor, dict[str, Any]] = {}
        self.param_groups: list[dict[str, Any]] = []
        self._warned_no_grads = False
        if isinstance(params, Tensor):
            raise TypeError("params argument given to the optimizer should be an iterable of Tensors or dicts, "
                            "but got a Tensor")
        groups = list(params)
        if not groups:
            raise ValueError("optimizer got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for g in groups:
            self.add_param_group(g)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        group = dict(param_group)
        params = group["params"]
        group["params"] = [params] if isinstance(params, Tensor) else list(params)
        for p in group["params"]:
            if not isinstance(p, Tensor):
                raise TypeError(f"optimizer can only optimize Tensors, but one of the params is {type(p).__name__}")
            if p.grad_fn is not None:
                raise ValueError("can't optimize a non-leaf Tensor")
        for name, default in self.defaults.items():
            if default is required and name not in group:
                raise ValueError(f"parameter group didn't specify a value of required optimization parameter {name}")
            group.setdefault(name, default)
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        if len({id(p) for p in group["params"]}) != len(group["params"]) or any(id(p) in seen for p in group["params"]):
            raise ValueError("some parameters appear in more than one parameter group")
        self.param_groups.append(group)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        step = cls.__dict__.get("step")
        if step is not None:
            # the subclass's own signature is kept: ``step(self)`` without a closure is
            # called without one, as PyTorch's wrapper passes on whatever it was given
            @functools.wraps(step)
            def locked_step(self: Optimizer, *args: Any, **kwargs: Any) -> Any:
                with grad_lock():  # every .grad from one commit or another, whole
                    return step(self, *args, **kwargs)

            cls.step = locked_step  # type: ignore[method-assign]

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Reset every parameter's ``.grad`` (to None by default, as PyTorch)."""
        with grad_lock():
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        p.grad = None if set_to_none else Tensor._wrap(np.zeros_like(p.grad.data))

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        raise NotImplementedError

    def _warn_if_no_grads(self) -> None:
        """Warn (once per optimizer) when ``step()`` finds no parameter with a gradient.

        PyTorch silently does nothing then. Here the usual cause is a backward that never
        ran: ``ag.backward(loss)`` without ``await`` only creates a coroutine."""
        if self._warned_no_grads:
            return
        if any(p._grad is not None for group in self.param_groups for p in group["params"]):
            return
        self._warned_no_grads = True
        warnings.warn(
            f"{type(self).__name__}.step() found no parameter with a gradient (every .grad is None), so it "
            "changed nothing. Did you forget to `await ag.backward(loss)`? Without `await` the backward "
            "never runs (Python then also warns \"coroutine ... was never awaited\"); in synchronous code "
            "use loss.backward() or ag.backward_sync(loss).",
            UserWarning, stacklevel=3)

    def _params_with_grad(self, group: dict[str, Any]) -> Iterable[tuple[Tensor, np.ndarray]]:
        for p in group["params"]:
            g = p.grad
            if g is None:
                continue
            yield p, g.data

    # --- state ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """``{"state": {index: {...}}, "param_groups": [{..., "params": [index, ...]}]}``
        with parameters numbered in group order, as PyTorch. State tensors are shared, not
        copied."""
        index: dict[int, int] = {}
        groups = []
        for g in self.param_groups:
            packed = {k: v for k, v in g.items() if k != "params"}
            ids = []
            for p in g["params"]:
                index.setdefault(id(p), len(index))
                ids.append(index[id(p)])
            packed["params"] = ids
            groups.append(packed)
        state = {index[id(p)]: s for p, s in self.state.items() if id(p) in index}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore hyper-parameters and state saved by :meth:`state_dict` (deep-copied, and
        floating state cast to each parameter's dtype)."""
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups):
            raise ValueError("loaded state dict has a different number of parameter groups")
        for mine, theirs in zip(self.param_groups, saved_groups):
            if len(mine["params"]) != len(theirs["params"]):
                raise ValueError("loaded state dict contains a parameter group that doesn't match the size "
                                 "of optimizer's group")
        id_map = {i: p for mine, theirs in zip(self.param_groups, saved_groups)
                  for i, p in zip(theirs["params"], mine["params"])}
        state: dict[Tensor, dict[str, Any]] = {}
        for i, s in state_dict["state"].items():
            p = id_map.get(int(i))
            if p is None:
                continue
            state[p] = {k: _cast_state(v, p) for k, v in s.items()}
        for mine, theirs in zip(self.param_groups, saved_groups):
            for k, v in theirs.items():
                if k != "params":
                    mine[k] = copy.deepcopy(v)
        self.state = state

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__} ("]
        for i, g in enumerate(self.param_groups):
            lines.append(f"Parameter Group {i}")
            lines.extend(f"    {k}: {v}" for k, v in sorted(g.items()) if k != "params")
        return "\n".join(lines) + "\n)"


def _cast_state(value: Any, p: Tensor) -> Any:
    if isinstance(value, Tensor):
        arr = value.data
        if arr.dtype.kind == "f":
            arr = arr.astype(p.dtype)
        return Tensor._wrap(np.array(arr, copy=True))
    if isinstance(value, np.ndarray):
        return Tensor._wrap(np.array(value, dtype=p.dtype if value.dtype.kind == "f" else value.dtype))
    return copy.deepcopy(value)


def _commit(p: Tensor) -> None:
    """Record one in-place change of ``p``'s array (its version counter, as ``add_`` does)."""
    p._version_counter.value += 1
