"""Note [Buckets]: how DDP groups parameters for all-reduce.

Parameters are taken in reverse registration order (the order their gradients tend to
become ready in backward, as in PyTorch's Reducer) and packed into flat buffers of one
dtype: the first bucket is small (1 MB, or the cap if smaller) so communication starts early, the others hold
up to ``bucket_cap_mb``. The layout is computed once at wrap time from the parameters
alone, so it is identical on every rank. A round (one DDP backward) copies each
gradient into its slot when it becomes ready; a bucket whose slots are all filled is
launched, but only after every bucket before it, so every rank posts its all-reduces in
the same order whatever order its gradients arrived in.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..tensor import Tensor

FIRST_BUCKET_BYTES = 1 << 20  # PyTorch's dist._DEFAULT_FIRST_BUCKET_BYTES


@dataclass
class Slot:
    bucket: int
    offset: int
    size: int
    shape: tuple[int, ...]


@dataclass
class Bucket:
    dtype: np.dtype
    cap: int  # bytes
    params: list[int] = field(default_factory=list)  # indices into Layout.params
    numel: int = 0
    buffer: np.ndarray = field(default_factory=lambda: np.empty(0))


class Layout:
    """Which bucket and offset each parameter's gradient goes to (Note [Buckets])."""

    def __init__(self, params: list[Tensor], cap_bytes: int, first_bytes: int = FIRST_BUCKET_BYTES) -> None:
        self.params = params  # in registration order; slots are filled in reverse
        self.slots: list[Slot] = [Slot(0, 0, 0, ())] * len(params)
        self.buckets: list[Bucket] = []
        open_by_dtype: dict[np.dtype, int] = {}
        for i in reversed(range(len(params))):
            p = params[i]
            dtype = np.dtype(p.dtype)
            nbytes = p.numel() * dtype.itemsize
            b = open_by_dtype.get(dtype)
            if b is None or (self.buckets[b].numel * dtype.itemsize + nbytes > self.buckets[b].cap
                             and self.buckets[b].params):
                b = open_by_dtype[dtype] = len(self.buckets)
                self.buckets.append(Bucket(dtype, min(first_bytes, cap_bytes) if b == 0 else cap_bytes))
            bucket = self.buckets[b]
            self.slots[i] = Slot(b, bucket.numel, p.numel(), tuple(p.shape))
            bucket.params.append(i)
            bucket.numel += p.numel()
        self.reallocate()

    def reallocate(self) -> None:
        """Fresh buffers (after a timeout, the old ones may still be in MPI's hands)."""
        for bucket in self.buckets:
            bucket.buffer = np.zeros(bucket.numel, dtype=bucket.dtype)

    def view(self, i: int) -> np.ndarray:
        """Parameter ``i``'s slot in its bucket's buffer, shaped like the parameter."""
        s = self.slots[i]
        return self.buckets[s.bucket].buffer[s.offset:s.offset + s.size].reshape(s.shape)
