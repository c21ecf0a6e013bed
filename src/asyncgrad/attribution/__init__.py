"""Attribution (saliency) methods as coroutines: which parts of an input a model's output
depends on. Each batches its perturbed copies of the inputs into one forward and one
``await ag.grad(...)`` (per ``internal_batch_size`` rows, if given) and never touches
``.grad``. The argument names follow Captum's where they fit."""

from ._grad_cam import grad_cam
from ._integrated_gradients import integrated_gradients
from ._saliency import saliency, smoothgrad

__all__ = ["grad_cam", "integrated_gradients", "saliency", "smoothgrad"]
