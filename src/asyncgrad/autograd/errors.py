"""Named errors of the engine itself.

An invariant of the engine that breaks is a bug in asyncgrad, never in user code. It
raises :class:`EngineInternalError` naming the invariant, as trio raises
``TrioInternalError``, so it is never mistaken for an error of a node or a hook.
"""

from __future__ import annotations


class EngineInternalError(RuntimeError):
    """An engine invariant broke (a bug in asyncgrad: please report it)."""

    def __init__(self, invariant: str) -> None:
        super().__init__(f"asyncgrad: internal error: {invariant}")
