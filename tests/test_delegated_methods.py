"""Tensor's delegated methods (Note [Delegated methods] in tensor.py): the installed
methods run the code of the tables' functions, with those functions' signatures (the
tensor as ``self``) and docstrings;
the class body names the same methods for type checkers; in-place ones take keyword
arguments as their positional ones."""

from __future__ import annotations

import ast
import inspect
import sys
from pathlib import Path

import numpy as np
import pytest

import asyncgrad as ag
from asyncgrad import creation, sampling
from asyncgrad import functional as F
from asyncgrad.tensor import Tensor

T = sys.modules["asyncgrad.tensor"]  # (``asyncgrad.tensor`` is the factory function)

TENSOR_PY = Path(T.__file__)


def _type_checking_names() -> dict[str, str]:
    """``name = module.function`` lines of the class body's ``if TYPE_CHECKING:`` block."""
    cls = next(n for n in ast.parse(TENSOR_PY.read_text()).body if isinstance(n, ast.ClassDef) and n.name == "Tensor")
    found: dict[str, str] = {}
    for node in cls.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for stmt in node.body:
                assert isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Attribute)
                found[stmt.targets[0].id] = f"{stmt.value.value.id}.{stmt.value.attr}"  # type: ignore[attr-defined]
    return found


def test_the_type_checkers_names_are_the_installed_methods() -> None:
    stubs = _type_checking_names()
    expected = {n: f"F.{'clamp' if n == 'clip' else n}" for n in T.FUNCTIONAL_METHODS}
    expected |= {n: f"F.{op}" for n, op in T.IN_PLACE_METHODS.items()}
    expected |= {n: f"sampling.{n}" for n in T.SAMPLING_METHODS} | {n: f"creation.{n}" for n in T.CREATION_METHODS}
    assert stubs == expected


def _is_method_form(method: object, fn: object) -> None:
    """``method`` runs ``fn``'s code (no extra call) and shows its parameters and doc."""
    assert method.__code__ is fn.__code__ and method.__defaults__ == fn.__defaults__  # type: ignore[attr-defined]
    params = list(inspect.signature(method).parameters.values())  # type: ignore[arg-type]
    expected = list(inspect.signature(fn).parameters.values())  # type: ignore[arg-type]
    assert params[0].name == "self" and params[1:] == expected[1:]
    assert fn.__doc__ and method.__doc__.startswith(fn.__doc__.rstrip())  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", T.FUNCTIONAL_METHODS)
def test_a_delegated_method_is_its_functions_code(name: str) -> None:
    _is_method_form(Tensor.__dict__[name], getattr(F, name))
    assert Tensor.__dict__[name].__qualname__ == f"Tensor.{name}"


@pytest.mark.parametrize(("module", "name"), [(sampling, n) for n in T.SAMPLING_METHODS]
                         + [(creation, n) for n in T.CREATION_METHODS])
def test_sampling_and_creation_methods_are_their_functions_code(module: object, name: str) -> None:
    _is_method_form(Tensor.__dict__[name], getattr(module, name))


@pytest.mark.parametrize(("name", "op"), T.IN_PLACE_METHODS.items())
def test_an_in_place_method_has_its_ops_signature_and_a_docstring(name: str, op: str) -> None:
    method = Tensor.__dict__[name]
    params = list(inspect.signature(method).parameters.values())
    expected = list(inspect.signature(getattr(F, op)).parameters.values())
    assert params[0].name == "self" and [(p.name, p.default) for p in params[1:]] == [
        (p.name, p.default) for p in expected[1:]]
    assert method.__name__ == name and method.__qualname__ == f"Tensor.{name}"
    assert f"``{getattr(F, op).__name__}``" in method.__doc__


def test_methods_compute_what_the_functions_do() -> None:
    x = ag.tensor([[0.5, -1.0], [2.0, 3.0]], requires_grad=True)
    np.testing.assert_array_equal(x.exp().data, F.exp(x).data)
    np.testing.assert_array_equal(x.sum(axis=1, keepdims=True).data, F.sum(x, 1, True).data)  # numpy aliases
    values, indices = x.max(dim=1)
    assert values.tolist() == [0.5, 3.0] and indices.tolist() == [0, 1]
    assert x.clip(min=0.0).tolist() == [[0.5, 0.0], [2.0, 3.0]]


def test_an_in_place_method_given_a_tensor_by_keyword_records_it_as_by_position() -> None:
    for by_keyword in (False, True):
        src = ag.tensor([1.0, 2.0], requires_grad=True)
        z = ag.zeros(2)  # does not require grad: only the argument makes the change recorded
        z.copy_(src=src) if by_keyword else z.copy_(src)
        assert z.grad_fn is not None, by_keyword
        (z * ag.tensor([3.0, 4.0])).sum().backward()
        assert src.grad is not None and src.grad.tolist() == [3.0, 4.0], by_keyword


def test_an_in_place_method_called_wrongly_raises_and_changes_nothing() -> None:
    x = ag.tensor([1.0, 2.0])
    with pytest.raises(TypeError):
        x.fill_(wrong=3.0)
    with pytest.raises(TypeError):
        x.fill_()
    assert x.tolist() == [1.0, 2.0] and x._version == 0
