"""``Sessions``: the operator's credential on the console's write actions, and CSRF protection.

A write from the page (answering a waiting task) needs the registry's write token
(``MESH_REGISTRY_TOKEN``): the operator gives it once on the login form, and gets a session. A
registry without a write token has no operator credential to check: its console is read-only
(every write refused, the page says how to enable it).

A browser sends a site's cookies with requests other sites make it send, so a session cookie
alone would let any page the operator visits answer tasks. Three checks, each enough against
a different attacker:

- the cookie is ``HttpOnly`` and ``SameSite=Strict`` (and ``Secure`` over https): a browser does
  not attach it to a request started from another site;
- every write carries the session's CSRF token (a hidden form field, random per session,
  compared in constant time), which another page cannot read: this is the check that holds
  when SameSite does not, since a "site" ignores the port: any other service on the same host
  (``127.0.0.1:9000``) is same-site with the registry and its forms would get the cookie;
- the ``Origin`` header (else ``Referer``), when the browser sends one, must be the registry's
  own origin: a form posted from elsewhere is refused before its fields are read. The login
  form is checked this way too (a forged login would sign the operator into a session the
  attacker chose).

Sessions live in memory (a restart signs everyone out), at most ``MAX_SESSIONS`` (the oldest
goes), each for ``SESSION_S``. The write token never goes into a cookie or a page.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import Response

__all__ = ["COOKIE", "MAX_SESSIONS", "SESSION_S", "Session", "Sessions", "same_origin"]

COOKIE = "mesh_console"
MAX_SESSIONS = 64
SESSION_S = 12 * 3600.0


@dataclass(frozen=True)
class Session:
    """One signed-in operator: the CSRF token the page's forms carry, and when it ends."""

    csrf: str
    expires_at: float


def same_origin(request: Request) -> bool:
    """Whether the request's ``Origin`` (else ``Referer``) is the registry's own origin, as the
    browser addressed it (scheme, ``Host``). A request with neither (not a browser's form)
    passes this check; the session's CSRF token still has to be right."""
    origin = request.headers.get("origin")
    if origin is None:
        referer = request.headers.get("referer")
        if referer is None:
            return True
        parts = urlsplit(referer)
        origin = f"{parts.scheme}://{parts.netloc}"
    host = request.headers.get("host", "")
    return bool(host) and origin == f"{request.url.scheme}://{host}"


class Sessions:
    """The signed-in operators (see the module docstring)."""

    def __init__(self, token: str | None, *, clock: Callable[[], float] = time.time) -> None:
        self._token = token
        self._clock = clock
        self._by_id: OrderedDict[str, Session] = OrderedDict()

    @property
    def enabled(self) -> bool:
        """Whether there is an operator credential to check (else the console is read-only)."""
        return self._token is not None

    def check_token(self, given: str) -> bool:
        return self._token is not None and hmac.compare_digest(
            given.strip().encode(), self._token.encode()
        )

    def open(self, response: Response, request: Request) -> Session:
        """A new session, its cookie set on ``response``."""
        sid = secrets.token_urlsafe(32)
        session = Session(secrets.token_urlsafe(32), self._clock() + SESSION_S)
        self._by_id[sid] = session
        while len(self._by_id) > MAX_SESSIONS:
            self._by_id.popitem(last=False)
        response.set_cookie(
            COOKIE,
            sid,
            max_age=int(SESSION_S),
            path="/",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return session

    def of(self, request: Request) -> Session | None:
        """The session of the request's cookie, if it is current."""
        sid = request.cookies.get(COOKIE)
        if not sid:
            return None
        session = self._by_id.get(sid)
        if session is None:
            return None
        if session.expires_at <= self._clock():
            del self._by_id[sid]
            return None
        return session

    def close(self, request: Request, response: Response) -> None:
        sid = request.cookies.get(COOKIE)
        if sid:
            self._by_id.pop(sid, None)
        response.delete_cookie(COOKIE, path="/")

    def may_read_tasks(self, request: Request, *, mesh_token: bool) -> bool:
        """Whether the request may see the task views. They show what the nodes show only with
        the mesh token (questions, inputs' traces, errors), so a registry that holds it shows
        them only to the operator: a session, or the write token as a bearer (API clients).
        Without a mesh token the nodes show them to anyone, and so does the console; without a
        write token no node is sent the mesh token (``registry.reach``): nothing to hide."""
        if not mesh_token or not self.enabled:
            return True
        if self.of(request) is not None:
            return True
        auth = request.headers.get("authorization", "")
        scheme, _, given = auth.partition(" ")
        return scheme.lower() == "bearer" and self.check_token(given)

    def refusal(self, request: Request, csrf: str) -> str | None:
        """Why a write from the page is refused (None: it may go on): no operator credential
        configured, another site's form, no session, or a wrong CSRF token."""
        if not self.enabled:
            return (
                "this registry has no write token, so the console is read-only: start it with "
                "MESH_REGISTRY_TOKEN to answer from the page"
            )
        if not same_origin(request):
            return "refused: the form was posted from another site"
        session = self.of(request)
        if session is None:
            return "sign in with the registry's write token first"
        if not hmac.compare_digest(csrf.encode(), session.csrf.encode()):
            return "refused: the form's CSRF token is not this session's (reload the page)"
        return None
