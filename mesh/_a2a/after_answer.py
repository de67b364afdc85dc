"""``AfterAnswer``: the work of a request that its answer does not need, done once the answer is
sent.

At one connection a caller waits while the node works, so only what the node does before its
answer's bytes leave is on the caller's path (a delegation's hop); what it does after runs while
the caller reads the answer. The fast route (``mesh._a2a.fastroute``) puts one in the call
context's state (``AFTER_ANSWER``) and runs it right after it sends the answer, or as the request
ends when none is sent (an error, a cancelled request): the executor hands it what the answer
does not need (the task's log line, its metrics, its count in flight) instead of doing it at
once. Under uvicorn the body's send writes to the socket without letting the loop run, so these
calls run before the loop serves anything else: a ``/metrics`` scrape or a ``GetTask`` on the
same node sees them as before. The store's commit is not deferred: the task is on disk before
its answer leaves. Without one in the state (the SDK's routes, an executor run by hand)
``later`` is None and the caller does the work at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from a2a.server.context import ServerCallContext

__all__ = ["AFTER_ANSWER", "AfterAnswer", "later"]

log = logging.getLogger("mesh._a2a")

#: Key of ``ServerCallContext.state``: the request's ``AfterAnswer``.
AFTER_ANSWER = "mesh.after_answer"


class AfterAnswer(list[Callable[[], object]]):
    """Calls to make once the request's answer is sent, in the order they were appended (a
    list: made and appended to in C, ~1 k instructions a request less than a class of its
    own; ``functools.partial`` binds a call's arguments)."""

    __slots__ = ()

    def run(self) -> None:
        """Make the calls appended so far (each once, in order). One that raises is logged and
        the others are still made: none of them may cost the request its answer, or another
        one its log line."""
        while self:
            calls = self[:]
            del self[:]
            for call in calls:
                try:
                    call()
                except Exception:
                    what = getattr(call, "func", call)  # a partial: the function it calls
                    log.exception(
                        "after an answer: %s failed", getattr(what, "__qualname__", repr(what))
                    )


def later(call: ServerCallContext | None) -> AfterAnswer | None:
    """The ``AfterAnswer`` of the request ``call`` serves, when a route sends its answer and then
    runs it; else None (do the work now)."""
    if call is None:
        return None
    after = call.state.get(AFTER_ANSWER)
    return after if type(after) is AfterAnswer else None
