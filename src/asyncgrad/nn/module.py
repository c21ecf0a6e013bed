"""``Module`` and ``Parameter``: the bookkeeping of a model's tensors, as in ``torch.nn``.

A parameter is a plain leaf :class:`~asyncgrad.Tensor` that requires grad (asyncgrad's
hot paths check ``type(t) is Tensor``, so there is no Tensor subclass). Assigning one as
an attribute of a module registers it (``self.weight = Parameter(...)``, or any leaf that
requires grad); assigning a module registers a child. ``isinstance(t, Parameter)`` is
true for every leaf tensor that requires grad. A frozen parameter (``requires_grad=False``)
is registered with ``register_parameter``.

Concurrency: the forward of a module only reads its parameters, so many tasks may call
one module at once and ``await ag.backward`` on their own losses; gradients accumulate
into the shared ``.grad`` as the sum of the calls (see API.md §3). Changing parameters
in place (an optimizer step, ``load_state_dict``) while another task's backward still
needs them makes that backward raise the usual "modified by an inplace operation"
error, so serialise updates with the backward calls that read the old values.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, NamedTuple
from collections.abc import Callable, Iterable, Iterator, Mapping

import numpy as np

from .._device import parse_to
from .._dtype import as_array, get_default_dtype
from ..autograd.graph import HookDict, RemovableHandle
from ..grad_mode import no_grad
from ..tensor import Tensor


# --- Parameter -------------------------------------------------------------------------------
class _ParameterMeta(type):
    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, Tensor) and obj.grad_fn is None and obj.requires_grad


def _make_parameter(data: Any = None, requires_grad: bool = True) -> Tensor:
    if data is None:
        data = np.empty(0, dtype=get_default_dtype())
    arr = data.data if isinstance(data, Tensor) else as_array(data)  # Python floats: default dtype
    t = Tensor._wrap(arr)  # shares memory with ``data``, as torch.nn.Parameter does
    if isinstance(data, Tensor):
        t._version_counter = data._version_counter
    t.requires_grad_(requires_grad)
    return t


if TYPE_CHECKING:  # to a type checker a Parameter is a kind of Tensor
    class Parameter(Tensor):
        def __new__(cls, data: Any = None, requires_grad: bool = True) -> Parameter: ...
else:
    class Parameter(metaclass=_ParameterMeta):
        """``Parameter(data, requires_grad=True)``: a leaf Tensor sharing ``data``'s memory
        that requires grad. It *is* a plain :class:`Tensor`; modules register it on
        attribute assignment."""

        def __new__(cls, data: Any = None, requires_grad: bool = True) -> Tensor:
            return _make_parameter(data, requires_grad)


def _is_parameter(value: Any) -> bool:
    return type(value) is Tensor and value.grad_fn is None and value.requires_grad


class IncompatibleKeys(NamedTuple):
    """What ``load_state_dict`` did not match: ``missing_keys`` and ``unexpected_keys``."""

    missing_keys: list[str]
    unexpected_keys: list[str]


# --- Module ------------------------------------------------------------------------------------
class Module:
    """Base class of every layer and model.

    Subclasses set parameters and submodules as attributes in ``__init__`` (after calling
    ``super().__init__()``) and implement ``forward``; calling the module calls ``forward``.
    """

    training: bool
    _parameters: dict[str, Tensor | None]
    _buffers: dict[str, Tensor | None]
    _modules: dict[str, Module | None]
    _forward_pre_hooks: HookDict
    _forward_hooks: HookDict

    def __init__(self) -> None:
        object.__setattr__(self, "training", True)
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "_forward_pre_hooks", HookDict())
        object.__setattr__(self, "_forward_hooks", HookDict())

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f'Module [{type(self).__name__}] is missing the required "forward" function')

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        pre, post = self._forward_pre_hooks, self._forward_hooks
        if not pre and not post:
            return self.forward(*args, **kwargs)
        for hook in list(pre.values()):
            replaced = hook(self, args)
            if replaced is not None:
                args = replaced if isinstance(replaced, tuple) else (replaced,)
        out = self.forward(*args, **kwargs)
        for hook in list(post.values()):
            replaced = hook(self, args, out)
            if replaced is not None:
                out = replaced
        return out

    def register_forward_pre_hook(self, hook: Callable[[Module, tuple[Any, ...]], Any]) -> RemovableHandle:
        """``hook(module, args) -> replacement args or None`` runs before ``forward``."""
        return self._forward_pre_hooks.add(hook)

    def register_forward_hook(self, hook: Callable[[Module, tuple[Any, ...], Any], Any]) -> RemovableHandle:
        """``hook(module, args, output) -> replacement output or None`` runs after ``forward``."""
        return self._forward_hooks.add(hook)

    # --- attribute registration ------------------------------------------------------------
    def __setattr__(self, name: str, value: Any) -> None:
        d = self.__dict__
        if "_parameters" not in d:
            raise AttributeError("cannot assign attributes before Module.__init__() call")
        params, buffers, modules = self._parameters, self._buffers, self._modules
        if isinstance(value, Module):
            self._forget(name)
            modules[name] = value
        elif _is_parameter(value):
            self._forget(name)
            params[name] = value
        elif name in params:
            if value is not None:
                raise TypeError(
                    f"cannot assign '{type(value).__name__}' as parameter '{name}' "
                    "(a leaf Tensor that requires grad, or None, expected)"
                )
            params[name] = None
        elif name in modules:
            if value is not None:
                raise TypeError(f"cannot assign '{type(value).__name__}' as child module '{name}' "
                                "(Module or None expected)")
            modules[name] = None
        elif name in buffers:
            if value is not None and not isinstance(value, Tensor):
                raise TypeError(f"cannot assign '{type(value).__name__}' as buffer '{name}' "
                                "(Tensor or None expected)")
            buffers[name] = value
        else:
            object.__setattr__(self, name, value)

    def _forget(self, name: str) -> None:
        self.__dict__.pop(name, None)
        self.__dict__.get("_non_persistent", set()).discard(name)
        self._parameters.pop(name, None)
        self._buffers.pop(name, None)
        self._modules.pop(name, None)

    def __getattr__(self, name: str) -> Any:
        # only called when normal lookup fails: look in the registries
        d = self.__dict__
        for registry in ("_parameters", "_buffers", "_modules"):
            reg = d.get(registry)
            if reg is not None and name in reg:
                return reg[name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __delattr__(self, name: str) -> None:
        for reg in (self._parameters, self._buffers, self._modules):
            if name in reg:
                del reg[name]
                return
        object.__delattr__(self, name)

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self._parameters) | set(self._buffers) | set(self._modules))

    def register_parameter(self, name: str, param: Tensor | None) -> None:
        """Register ``param`` (a leaf Tensor, or None) under ``name``, also when it does not
        require grad (a frozen parameter)."""
        if "." in name or not name:
            raise KeyError(f'parameter name can\'t contain "." or be empty, got {name!r}')
        if param is not None and (not isinstance(param, Tensor) or param.grad_fn is not None):
            raise TypeError(f"cannot assign '{type(param).__name__}' object to parameter '{name}' "
                            "(a leaf Tensor or None required)")
        self._forget(name)
        self._parameters[name] = param

    def register_buffer(self, name: str, tensor: Tensor | None, persistent: bool = True) -> None:
        """Register a tensor that is state but not a parameter (saved in ``state_dict``
        unless ``persistent=False``)."""
        if "." in name or not name:
            raise KeyError(f'buffer name can\'t contain "." or be empty, got {name!r}')
        if tensor is not None and not isinstance(tensor, Tensor):
            raise TypeError(f"cannot assign '{type(tensor).__name__}' object to buffer '{name}' "
                            "(Tensor or None required)")
        self._forget(name)
        self._buffers[name] = tensor
        if not persistent:
            self.__dict__.setdefault("_non_persistent", set()).add(name)

    def add_module(self, name: str, module: Module | None) -> None:
        if module is not None and not isinstance(module, Module):
            raise TypeError(f"{type(module).__name__} is not a Module subclass")
        if "." in name or not name:
            raise KeyError(f'module name can\'t contain "." or be empty, got {name!r}')
        self._forget(name)
        self._modules[name] = module

    register_module = add_module

    def get_submodule(self, target: str) -> Module:
        mod: Module = self
        for part in target.split(".") if target else ():
            child = mod._modules.get(part)
            if child is None:
                raise AttributeError(f"{type(mod).__name__} has no submodule `{part}`")
            mod = child
        return mod

    # --- traversal ---------------------------------------------------------------------
    def named_modules(self, memo: set[int] | None = None, prefix: str = "",
                      remove_duplicate: bool = True) -> Iterator[tuple[str, Module]]:
        """This module and every descendant, depth first, each once (by identity)."""
        seen = memo if memo is not None else set()
        stack: list[tuple[str, Module]] = [(prefix, self)]
        while stack:
            name, mod = stack.pop()
            if remove_duplicate:
                if id(mod) in seen:
                    continue
                seen.add(id(mod))
            yield name, mod
            children = [(f"{name}.{k}" if name else k, m) for k, m in mod._modules.items() if m is not None]
            stack.extend(reversed(children))

    def modules(self) -> Iterator[Module]:
        for _, m in self.named_modules():
            yield m

    def named_children(self) -> Iterator[tuple[str, Module]]:
        seen: set[int] = set()
        for name, m in self._modules.items():
            if m is not None and id(m) not in seen:
                seen.add(id(m))
                yield name, m

    def children(self) -> Iterator[Module]:
        for _, m in self.named_children():
            yield m

    def _named_members(self, registry: str, prefix: str, recurse: bool,
                       remove_duplicate: bool) -> Iterator[tuple[str, Tensor]]:
        seen: set[int] = set()
        mods = self.named_modules(prefix=prefix, remove_duplicate=remove_duplicate) if recurse else [(prefix, self)]
        for mod_prefix, mod in mods:
            for name, t in getattr(mod, registry).items():
                if t is None:
                    continue
                if remove_duplicate:
                    if id(t) in seen:
                        continue
                    seen.add(id(t))
                yield (f"{mod_prefix}.{name}" if mod_prefix else name), t

    def named_parameters(self, prefix: str = "", recurse: bool = True,
                         remove_duplicate: bool = True) -> Iterator[tuple[str, Tensor]]:
        """``(dotted name, parameter)`` pairs; a parameter shared by two modules appears once."""
        return self._named_members("_parameters", prefix, recurse, remove_duplicate)

    def parameters(self, recurse: bool = True) -> Iterator[Tensor]:
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_buffers(self, prefix: str = "", recurse: bool = True,
                      remove_duplicate: bool = True) -> Iterator[tuple[str, Tensor]]:
        return self._named_members("_buffers", prefix, recurse, remove_duplicate)

    def buffers(self, recurse: bool = True) -> Iterator[Tensor]:
        for _, b in self.named_buffers(recurse=recurse):
            yield b

    def apply(self, fn: Callable[[Module], None]) -> Module:
        """Call ``fn`` on every submodule (children first) and then on self."""
        for m in self.children():
            m.apply(fn)
        fn(self)
        return self

    # --- modes and gradients ------------------------------------------------------------
    def train(self, mode: bool = True) -> Module:
        """Set training mode (affects ``Dropout``) on this module and all descendants."""
        if not isinstance(mode, bool):
            raise ValueError("training mode is expected to be boolean")
        for m in self.modules():
            object.__setattr__(m, "training", mode)
        return self

    def eval(self) -> Module:
        return self.train(False)

    def requires_grad_(self, requires_grad: bool = True) -> Module:
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Reset the ``.grad`` of every parameter (to None by default, as PyTorch)."""
        for p in self.parameters():
            _zero_grad(p, set_to_none)

    def to(self, *args: Any, **kwargs: Any) -> Module:
        """``to(dtype)``, ``to(device, dtype=None)``, ``to(tensor)``, as PyTorch: cast
        floating parameters and buffers to ``dtype`` in place (the same Tensor objects
        keep their identity; gradients are dropped). The device must be the CPU, where
        everything already is, so moving there is a no-op."""
        dtype, _ = parse_to(args, kwargs, Tensor)
        if dtype is None:
            return self
        if dtype.kind not in "fc":
            raise TypeError(f"nn.Module.to only accepts floating point or complex dtypes, but got desired "
                            f"dtype={dtype}")
        d = dtype
        for t in [*self.parameters(), *self.buffers()]:
            if t.data.dtype.kind == "f" and t.data.dtype != d:
                t.data = t.data.astype(d)
                t._version_counter.value += 1
                t.grad = None
                t._acc_ref = None  # a new AccumulateGrad records the new dtype
        return self

    def cpu(self) -> Module:
        """A no-op (everything lives on the CPU); returns self."""
        return self

    def float(self) -> Module:
        return self.to(np.float32)

    def double(self) -> Module:
        return self.to(np.float64)

    # --- state ----------------------------------------------------------------------------
    def state_dict(self, prefix: str = "", keep_vars: bool = False) -> OrderedDict[str, Tensor]:
        """Every parameter and persistent buffer by dotted name. Values share memory with
        the module's tensors (``detach()``ed unless ``keep_vars``); copy before mutating."""
        out: OrderedDict[str, Tensor] = OrderedDict()
        for mod_prefix, mod in self.named_modules(prefix=prefix.rstrip(".")):
            skip = mod.__dict__.get("_non_persistent", ())
            for registry in (mod._parameters, mod._buffers):
                for name, t in registry.items():
                    if t is None or (registry is mod._buffers and name in skip):
                        continue
                    key = f"{mod_prefix}.{name}" if mod_prefix else name
                    out[key] = t if keep_vars else t.detach()
        return out

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True) -> IncompatibleKeys:
        """Copy values (Tensors or arrays) into the parameters and buffers in place.

        Errors: with ``strict`` (the default), missing or unexpected keys raise
        ``RuntimeError`` before anything is copied; a shape mismatch always raises, also
        before anything is copied.
        """
        own = self.state_dict(keep_vars=True)
        missing = [k for k in own if k not in state_dict]
        unexpected = [k for k in state_dict if k not in own]
        errors = []
        if strict:
            if unexpected:
                errors.append("Unexpected key(s) in state_dict: " + ", ".join(f'"{k}"' for k in unexpected) + ".")
            if missing:
                errors.append("Missing key(s) in state_dict: " + ", ".join(f'"{k}"' for k in missing) + ".")
        pairs = []
        for key, target in own.items():
            if key not in state_dict:
                continue
            value = state_dict[key]
            arr = np.asarray(value.data if isinstance(value, Tensor) else value)
            if arr.shape != target.shape:
                errors.append(f"size mismatch for {key}: copying a param with shape {list(arr.shape)} from "
                              f"checkpoint, the shape in current model is {list(target.shape)}.")
            pairs.append((target, arr))
        if errors:
            raise RuntimeError(f"Error(s) in loading state_dict for {type(self).__name__}:\n\t" + "\n\t".join(errors))
        with no_grad():
            for target, arr in pairs:
                target.copy_(Tensor._wrap(arr))
        return IncompatibleKeys(missing, unexpected)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write ``state_dict()`` to ``path`` with ``numpy.savez`` (no pickling; the file
        name is used as given, no ``.npz`` is appended)."""
        arrays = {k: np.ascontiguousarray(t.data) for k, t in self.state_dict().items()}
        with open(path, "wb") as f:
            np.savez(f, **arrays)  # type: ignore[arg-type]

    def load(self, path: str | os.PathLike[str], strict: bool = True) -> IncompatibleKeys:
        """Load a file written by :meth:`save` (read with ``allow_pickle=False``)."""
        with np.load(path, allow_pickle=False) as z:
            return self.load_state_dict({k: z[k] for k in z.files}, strict=strict)

    # --- repr --------------------------------------------------------------------------------
    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        lines = []
        for name, m in self._modules.items():
            child = repr(m).replace("\n", "\n  ")
            lines.append(f"({name}): {child}")
        extra = self.extra_repr()
        head = f"{type(self).__name__}({extra}"
        if not lines:
            return head + ")"
        return head + "\n  " + "\n  ".join(lines) + "\n)"


def _zero_grad(p: Tensor, set_to_none: bool) -> None:
    if p.grad is None:
        return
    if set_to_none:
        p.grad = None
    else:
        # a fresh zero array: the old one may be shared with a gradient held elsewhere
        p.grad = Tensor._wrap(np.zeros_like(p.grad.data))


# --- containers ----------------------------------------------------------------------------
class Sequential(Module):
    """Modules called in order, each on the previous one's output.

    ``Sequential(a, b)`` names the children ``"0"``, ``"1"``; ``Sequential(OrderedDict(...))``
    uses the given names.
    """

    def __init__(self, *args: Any) -> None:
        super().__init__()
        if len(args) == 1 and isinstance(args[0], Mapping):
            for name, m in args[0].items():
                self.add_module(name, m)
        else:
            for i, m in enumerate(args):
                self.add_module(str(i), m)

    def forward(self, input: Any) -> Any:
        for m in self._modules.values():
            if m is not None:
                input = m(input)
        return input

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(m for m in self._modules.values() if m is not None)

    def __getitem__(self, idx: int | slice) -> Any:
        items = list(self._modules.items())
        if isinstance(idx, slice):
            return Sequential(OrderedDict(items[idx]))
        return items[idx][1]

    def append(self, module: Module) -> Sequential:
        self.add_module(str(len(self)), module)
        return self


class ModuleList(Module):
    """A list of modules whose parameters the parent sees."""

    def __init__(self, modules: Iterable[Module] | None = None) -> None:
        super().__init__()
        for m in modules or ():
            self.append(m)

    def append(self, module: Module) -> ModuleList:
        self.add_module(str(len(self._modules)), module)
        return self

    def extend(self, modules: Iterable[Module]) -> ModuleList:
        for m in modules:
            self.append(m)
        return self

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(m for m in self._modules.values() if m is not None)

    def __getitem__(self, idx: int) -> Any:
        return list(self._modules.values())[idx]


class ModuleDict(Module):
    """A dict of modules whose parameters the parent sees."""

    def __init__(self, modules: Mapping[str, Module] | None = None) -> None:
        super().__init__()
        for k, m in (modules or {}).items():
            self.add_module(k, m)

    def __getitem__(self, key: str) -> Any:
        return self._modules[key]

    def __setitem__(self, key: str, module: Module) -> None:
        self.add_module(key, module)

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[str]:
        return iter(self._modules)

    def keys(self) -> Iterable[str]:
        return self._modules.keys()

    def items(self) -> Iterable[tuple[str, Module | None]]:
        return self._modules.items()

    def values(self) -> Iterable[Module | None]:
        return self._modules.values()
