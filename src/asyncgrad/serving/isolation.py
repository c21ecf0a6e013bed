"""Serving one batch to the end: every request gets its answer or its own error.

A pass that fails is rerun on parts of the batch until the requests at fault are found,
so one bad request costs the others a rerun, never their answers:

* the pass raised (``loss_fn``, a hook, a node's backward): split the batch in halves
  and rerun each; a request that raises alone gets that exception;
* some requests' losses or own gradients are not finite (``Culprits``): they fail, the
  rest is rerun;
* a summed parameter gradient is not finite and no single request's own gradients show
  why (``SplitNeeded``): split in halves; alone, the request gets the FloatingPointError;
* a request was withdrawn before the commit (``Withdrawn``): the rest is rerun.

Nothing of a failed pass was committed (commit on success), so reruns never count a
request twice. Each rerun counts one in ``statistics().retries``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from .batched_pass import Culprits, FailAll, SplitNeeded, Withdrawn
from .requests import GradientResult, Request
from .statistics import Counters

Pass = Callable[[list[Request]], Awaitable[list[GradientResult | None]]]


def _fail(r: Request, error: BaseException, counters: Counters) -> None:
    if r.state != "done":
        counters.failed += 1
        r.fail(error)


async def serve_batch(run_pass: Pass, batch: list[Request], counters: Counters) -> None:
    """Run passes over ``batch`` and its parts until every request is answered."""
    parts = [batch]
    first = True
    while parts:
        part = [r for r in parts.pop() if not r.withdrawn]
        if not part:
            continue
        if not first:
            counters.retries += 1
        first = False
        try:
            answers = await run_pass(part)
        except Culprits as c:
            for r, error in c.errors.items():
                _fail(r, error, counters)
            parts.append([r for r in part if r not in c.errors])
        except Withdrawn:
            parts.append(part)
        except FailAll as f:
            for r in part:
                _fail(r, f.error, counters)
        except Exception as e:
            error = e.error if isinstance(e, SplitNeeded) else e
            if len(part) == 1:
                _fail(part[0], error, counters)
            else:
                half = len(part) // 2
                parts += [part[half:], part[:half]]  # (the first half runs first)
        else:
            for r, answer in zip(part, answers):
                if answer is not None:
                    r.answer(answer)
