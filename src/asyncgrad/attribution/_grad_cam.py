"""Grad-CAM (Selvaraju et al. 2017): a layer's activations weighted by the spatial mean of
the target's gradient with respect to them, summed over channels."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..autograd import grad
from ..creation import tensor
from ..nn import functional as F
from ..nn.module import Module
from ..tensor import Tensor
from ._batch import (
    Model, Target, between_chunks, check_inputs, check_positive_int, chunks, example_targets, forward_args,
    rows_of_args, run_model, target_score,
)
from ._resize import resize_linear


def _upsample(cam: np.ndarray, size: tuple[int, ...]) -> np.ndarray:
    interpolate = getattr(F, "interpolate", None)  # (where this build has it)
    if interpolate is not None and cam.ndim == 4:
        return np.asarray(interpolate(tensor(cam), size=size, mode="bilinear", align_corners=False).numpy())
    return resize_linear(cam, size)


async def grad_cam(model: Model, layer: Module, inputs: Tensor, target: Target = None, *,
                   relu_attributions: bool = True, attribute_to_layer_input: bool = False,
                   upsample_to_input: bool = False, internal_batch_size: int | None = None,
                   additional_forward_args: Any = None) -> Tensor:
    """Grad-CAM for ``layer`` of ``model`` (Captum's ``LayerGradCam``): with ``A`` the
    layer's output (N, C, *spatial), captured by a forward hook, and ``G`` the gradient of
    each example's target output with respect to ``A``, the map is
    ``relu(sum_c mean_spatial(G)[:, c] * A[:, c])``, of shape (N, 1, *spatial). One forward
    and one backward (per ``internal_batch_size`` examples, if given).

    Args:
        model: as for `saliency`; it must call ``layer`` exactly once per forward.
        layer: the ``ag.nn.Module`` explained, usually a CNN's last convolution block.
        inputs: the examples, a floating Tensor of shape (N, ...).
        target: as for `saliency`.
        relu_attributions: apply the ReLU of Grad-CAM's definition (on by default; Captum's
            ``LayerGradCam`` leaves it off unless asked).
        attribute_to_layer_input: explain the layer's (first) input instead of its output.
        upsample_to_input: resize the map bilinearly (linearly per spatial axis,
            ``align_corners=False``) to the spatial size of ``inputs``, ``inputs.shape[2:]``.
        internal_batch_size: at most this many examples per forward and backward.
        additional_forward_args: as for `saliency`.

    Returns:
        A Tensor of shape (N, 1, *spatial) and ``inputs``'s dtype, detached. For a layer
        output of shape (N, C), with no spatial axes, the map is ``sum_c G * A`` (N, 1).

    Cancellation: the call stops at its next checkpoint: before each chunk's forward, or
    inside its backward (cancelled as ``ag.grad`` is). The hook is removed before the
    backward starts; no ``.grad`` is read or written either way.

    Errors: ``ValueError`` naming the argument for bad ``inputs``, ``target``, ``layer``
    (not a Module, not called by ``model``, called more than once, or giving no Tensor) or
    ``internal_batch_size``; ``upsample_to_input`` with inputs of another rank than the map.
    """
    if not isinstance(layer, Module):
        raise ValueError(f"layer must be an ag.nn.Module (one called by model), got {type(layer).__name__}")
    x = check_inputs(inputs)
    n = x.shape[0]
    targets = example_targets(target, n)
    chunk = check_positive_int("internal_batch_size", internal_batch_size, optional=True)
    args = forward_args(additional_forward_args)
    maps = [await _layer_map(model, layer, x[rows], None if targets is None else targets[rows],
                             rows_of_args(args, rows, n), attribute_to_layer_input, upsample_to_input)
            for rows in chunks(n, chunk)]
    cam = np.concatenate(maps)
    if relu_attributions:
        cam = np.maximum(cam, 0)
    if upsample_to_input:
        cam = _upsample(cam, x.shape[2:])
    return tensor(cam.astype(x.dtype))


async def _layer_map(model: Model, layer: Module, x: np.ndarray, targets: np.ndarray | None,
                     args: tuple[Any, ...], to_input: bool, upsample: bool) -> np.ndarray:
    """Grad-CAM's map before the ReLU for the examples ``x``: one forward, one backward."""
    await between_chunks()
    captured: list[Any] = []

    def capture(module: Module, layer_args: tuple[Any, ...], output: Any) -> None:
        if to_input:
            captured.append(layer_args[0] if layer_args else None)
        else:
            captured.append(output)

    handle = layer.register_forward_hook(capture)
    try:
        out = run_model(model, tensor(x, requires_grad=True), args)
    finally:
        handle.remove()
    which = "input" if to_input else "output"
    if len(captured) != 1:
        raise ValueError(f"layer must be called exactly once by model's forward, it was called {len(captured)} times")
    activation = captured[0]
    if not isinstance(activation, Tensor) or activation.ndim < 2 or activation.shape[0] != x.shape[0]:
        raise ValueError(f"layer's {which} must be a Tensor of shape (N, C, ...) for the {x.shape[0]} examples, "
                         f"got {getattr(activation, 'shape', type(activation).__name__)}")
    if upsample and x.ndim != activation.ndim:
        raise ValueError(f"upsample_to_input needs inputs with the layer {which}'s {activation.ndim - 2} spatial "
                         f"axes, got inputs of shape {x.shape} and a layer {which} of shape {activation.shape}")
    score = target_score(out, targets)
    (g,) = await grad(score, [activation], allow_unused=True, materialize_grads=True)
    assert g is not None  # (materialize_grads)
    grads, acts = g.numpy(), activation.detach().numpy()
    spatial = tuple(range(2, acts.ndim))
    weights = grads.mean(axis=spatial, keepdims=True) if spatial else grads
    return np.asarray((weights * acts).sum(axis=1, keepdims=True))
