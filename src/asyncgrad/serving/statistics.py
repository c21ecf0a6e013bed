"""The batcher's counters and their frozen snapshot (``GradientBatcher.statistics()``)."""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class BatcherStatistics:
    """A snapshot of a batcher's counters.

    ``requests``: submitted requests that passed validation; ``batches``: batches formed
    from the queue; ``rows``: rows of those requests; ``retries``: passes rerun to isolate
    a failing or withdrawn request (each rerun of a part of a batch counts one);
    ``failed``: requests answered with an error (bad input counts too); ``cancelled``:
    requests whose caller was cancelled before the answer; ``per_request_backwards``:
    backward calls of one request each, run because some parameter had no per-sample
    rule (the fallback of ``per_request_param_grads``)."""

    requests: int = 0
    batches: int = 0
    rows: int = 0
    retries: int = 0
    failed: int = 0
    cancelled: int = 0
    per_request_backwards: int = 0


class Counters:
    """The mutable counters behind :class:`BatcherStatistics`; written on the loop only."""

    def __init__(self) -> None:
        for f in fields(BatcherStatistics):
            setattr(self, f.name, 0)

    requests: int
    batches: int
    rows: int
    retries: int
    failed: int
    cancelled: int
    per_request_backwards: int

    def snapshot(self) -> BatcherStatistics:
        return BatcherStatistics(**{f.name: getattr(self, f.name) for f in fields(BatcherStatistics)})
