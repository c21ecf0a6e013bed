"""The errors a distributed backward or collective raises (API.md §9)."""

from __future__ import annotations

from collections.abc import Sequence


class RemoteBackwardError(RuntimeError):
    """The backward failed or was cancelled on other ranks, so no rank committed.

    ``failed_ranks`` lists them in ascending order."""

    def __init__(self, failed_ranks: Sequence[int]) -> None:
        self.failed_ranks = tuple(sorted(failed_ranks))
        ranks = ", ".join(str(r) for r in self.failed_ranks)
        super().__init__(f"the distributed backward failed or was cancelled on rank(s) {ranks}; "
                         f"no rank committed its gradients")


class DistributedTimeout(RuntimeError):
    """A collective made no progress for ``timeout`` seconds: some rank stopped."""
