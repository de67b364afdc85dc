"""``reason_of``: why a call to a peer failed, as a ``RemoteReason``, decided in one place.

The A2A client (``mesh._a2a.client``) names the reason of every ``RemoteError`` it raises from an
httpx error with it, and the retry policy (``mesh._resilience.is_retryable``) retries exactly the
exceptions whose reason is ``"unavailable"``: this instance could not take the call, another one
may. So a raw httpx error in a caller's own attempt function is retried, or not, the way the same
error inside a delegation is.

    reason_of(httpx.ConnectError("refused"))           # "unavailable"
    reason_of(RemoteError(..., reason="rejected"))      # "rejected"
"""

from __future__ import annotations

import httpx

from mesh._errors import CircuitOpen, DeadlineExceeded, RemoteError, RemoteReason

__all__ = ["NOT_A2A_STATUS", "RETRYABLE_STATUS", "reason_of", "status_of"]

#: An outage in front of the node (a proxy, a load balancer): another instance may answer.
RETRYABLE_STATUS = frozenset({502, 503, 504})
#: No A2A endpoint at that URL (a JSON-RPC route answers every POST /): whatever is there is
#: not a working node, another instance may be.
NOT_A2A_STATUS = frozenset({404, 405})


def status_of(exc: BaseException) -> int | None:
    """The HTTP status behind an error (the a2a-sdk wraps httpx's ``HTTPStatusError``)."""
    cause = exc if isinstance(exc, httpx.HTTPStatusError) else exc.__cause__
    return cause.response.status_code if isinstance(cause, httpx.HTTPStatusError) else None


def reason_of(exc: BaseException) -> RemoteReason:
    """The reason a call failed with ``exc``:

    - ``RemoteError``: its ``reason``; ``DeadlineExceeded``: ``deadline``; ``CircuitOpen``:
      ``unavailable``;
    - an HTTP status: 401/403 ``rejected`` (the node wants the mesh token, every instance would
      say so), 404/405 and 502/503/504 ``unavailable``, any other ``failed`` (an answer);
    - a connect timeout, a refused or dropped connection, an answer that is not HTTP or over
      the byte cap (any other ``httpx.RequestError``), the builtin ``ConnectionError`` and a
      per-attempt ``TimeoutError``: ``unavailable``;
    - any other httpx timeout: ``deadline`` (a peer call's timeout is the call's deadline);
    - an error the a2a-sdk raised for one of these (its ``__cause__``): the same;
    - anything else: ``failed``.
    """
    if isinstance(exc, RemoteError):
        return exc.reason
    if isinstance(exc, DeadlineExceeded):
        return "deadline"
    if isinstance(exc, CircuitOpen | ConnectionError | httpx.ConnectTimeout):
        return "unavailable"
    if isinstance(exc, httpx.TimeoutException):
        return "deadline"
    if isinstance(exc, TimeoutError):
        return "unavailable"
    if isinstance(exc, httpx.HTTPStatusError):
        status = exc.response.status_code
        if status in (401, 403):
            return "rejected"
        return "unavailable" if status in RETRYABLE_STATUS | NOT_A2A_STATUS else "failed"
    if isinstance(exc, httpx.RequestError):
        return "unavailable"
    cause = exc.__cause__
    if isinstance(cause, httpx.HTTPError):
        return reason_of(cause)
    return "failed"
