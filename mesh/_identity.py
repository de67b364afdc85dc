"""Caller identity on every call: a short-lived token, signed by the calling agent's key.

A node with keys (``mesh._keys.AgentKeys``) presents, on every A2A call to a verified peer,
``Authorization: Bearer <token>`` where the token is a JWT (ES256) signed with its own key:

    header  {"alg": "ES256", "typ": "mesh-call+jwt", "kid": <its key's thumbprint>,
             "mesh_cert": <the root's certificate of that key>}
    claims  {"iss": <calling agent>, "aud": <called agent>, "iat", "exp": iat + 5 min,
             "jti": <unique id>}

The callee (``CallerCheck``) needs only the mesh's root: the certificate gives the key and the
agent it belongs to; it accepts the token when that root signed the certificate, the token
verifies with the certified key, ``iss`` is the certified agent, ``aud`` is the callee's own
name, it has not expired (and lives at most ``MAX_LIFETIME_S``), and its ``jti`` was not seen
before. So a token taken from one call opens nothing else: not another agent (``aud``), not a
second call (``jti``), not later (``exp``); and the key that could mint new ones never travels.

The end user (``PRINCIPAL``): when the request a node serves is on behalf of someone, the tokens
it mints while serving it carry them as ``sub``, for audit. A node takes it from the verified
call token of its own request (``sub``), or, from a request opened with the mesh token (the CLI,
the console, a gateway holding it), from the ``Mesh-Principal`` header (``mesh._gate``). The
callee logs it with the call; nothing is decided on it.
"""

from __future__ import annotations

import base64
import binascii
import json
import time
import uuid
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

from mesh._errors import PeerRefused
from mesh._keys import ALGORITHM, AgentKeys, Certified, TrustRoot

if TYPE_CHECKING:
    from jwt.algorithms import ECAlgorithm

__all__ = [
    "CALL_TOKEN_S",
    "MAX_PRINCIPAL",
    "PRINCIPAL",
    "Caller",
    "CallerCheck",
    "CallerIdentity",
    "principal_problem",
]

CALL_TOKEN_TYPE = "mesh-call+jwt"
#: Seconds a call token is valid for (minutes: long enough for clock skew, short if stolen).
CALL_TOKEN_S = 300
#: The longest lifetime a callee accepts (a token valid for hours is a leak waiting to happen).
MAX_LIFETIME_S = 900
# Seconds of clock skew tolerated between nodes.
_LEEWAY_S = 30
# Certificates whose check is remembered (one per calling agent key), and token ids remembered
# until they expire; past the cap the oldest go (they are the first to expire).
_MAX_CERTS = 1024
_MAX_SEEN = 200_000


# PyJWT's ES256 (sign and verify over the JWS signing input, raw r||s signatures). The tokens
# are made and read with it directly: a caller's header is the same on every token (its key
# and certificate, most of the token's bytes), so it is encoded once by the minter and checked
# once per distinct header by the callee; jwt.encode/decode redid both on every call, which
# cost more than the signature itself (docs/performance.md, "Signed identity"). Made on first
# use: a node without keys never imports PyJWT (tests/test_import_cost.py).
@cache
def _es256() -> ECAlgorithm:
    from jwt.algorithms import ECAlgorithm

    return ECAlgorithm(ECAlgorithm.SHA256)


def base64url_encode(raw: bytes) -> bytes:
    """base64url without padding (PyJWT's ``base64url_encode``)."""
    return base64.urlsafe_b64encode(raw).replace(b"=", b"")


_REQUIRED = ("iss", "aud", "iat", "exp", "jti")


#: The end user the request being served is on behalf of (set per request by the gate; the
#: tasks a request starts inherit it): call tokens minted meanwhile carry it as ``sub``.
PRINCIPAL: ContextVar[str | None] = ContextVar("mesh_principal", default=None)
#: The longest principal accepted (an email address, a user id: not a document).
MAX_PRINCIPAL = 256


def principal_problem(value: object) -> str | None:
    """Why ``value`` cannot be a principal (1-256 visible ASCII characters), else None."""
    if (
        isinstance(value, str)
        and 0 < len(value) <= MAX_PRINCIPAL
        and value.isascii()
        and value.isprintable()
        and value.strip() == value
    ):
        return None
    return f"a principal is 1-{MAX_PRINCIPAL} visible ASCII characters without spaces at the ends"


@dataclass(frozen=True)
class Caller:
    """The verified caller of one request, and the end user it calls for (``sub``), if any."""

    agent: str
    kid: str
    principal: str | None = None


class CallerIdentity:
    """Mints the call tokens of one agent (``token(audience)``), one per call."""

    def __init__(
        self,
        keys: AgentKeys,
        *,
        ttl_s: int = CALL_TOKEN_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.agent = keys.agent
        self._keys = keys
        self.ttl_s = ttl_s
        self.clock = clock
        header = {
            "alg": ALGORITHM,
            "typ": CALL_TOKEN_TYPE,
            "kid": keys.kid,
            "mesh_cert": keys.certificate,
        }
        self._header = base64url_encode(json.dumps(header, separators=(",", ":")).encode())

    def __repr__(self) -> str:
        return f"CallerIdentity(agent={self.agent!r}, kid={self._keys.kid!r})"

    def token(self, audience: str) -> str:
        """A fresh token naming this agent as the caller of ``audience``."""
        now = int(self.clock())
        claims = {
            "iss": self.agent,
            "aud": audience,
            "iat": now,
            "exp": now + self.ttl_s,
            "jti": uuid.uuid4().hex,
        }
        principal = PRINCIPAL.get()
        if principal is not None:
            claims["sub"] = principal
        payload = base64url_encode(json.dumps(claims, separators=(",", ":")).encode())
        signing_input = self._header + b"." + payload
        signature = _es256().sign(signing_input, self._keys.key)
        return (signing_input + b"." + base64url_encode(signature)).decode("ascii")


class CallerCheck:
    """Verifies the call tokens presented to the agent ``audience`` (see the module docstring).
    ``verify`` returns the ``Caller`` or raises ``PeerRefused`` saying why."""

    def __init__(
        self, root: TrustRoot, audience: str, *, clock: Callable[[], float] = time.time
    ) -> None:
        self.root = root
        self.audience = audience
        self.clock = clock
        self._certs: dict[str, Certified] = {}
        # A caller's tokens all have the same header (its key's kid and certificate): each
        # distinct header is read and checked once. PyJWT's parse of a token this size (the
        # certificate is most of it) costs as much as the signature's check.
        self._headers: dict[str, Certified] = {}
        self._seen: dict[str, float] = {}

    def verify(self, token: str) -> Caller:
        now = self.clock()
        certified = self._headers.get(token.partition(".")[0])
        if certified is None:
            certified = self._header(token, now)
        elif certified.expires_at <= now:
            raise PeerRefused(f"the certificate of {certified.agent!r} has expired")
        claims = self._claims(token, certified, now)
        if claims["iss"] != certified.agent:
            raise PeerRefused(
                f"the call token names {claims['iss']!r} but is signed by {certified.agent!r}"
            )
        if float(claims["exp"]) - float(claims["iat"]) > MAX_LIFETIME_S:
            raise PeerRefused(f"the call token lives longer than {MAX_LIFETIME_S} s")
        jti = str(claims["jti"])
        self._forget_expired(now)
        if jti in self._seen:
            raise PeerRefused(f"the call token of {certified.agent!r} was used before (replayed)")
        if len(self._seen) >= _MAX_SEEN:
            self._seen.pop(next(iter(self._seen)))
        self._seen[jti] = float(claims["exp"]) + _LEEWAY_S
        principal = claims.get("sub")
        if principal is not None and principal_problem(principal) is not None:
            raise PeerRefused(f"the call token's sub: {principal_problem(principal)}")
        return Caller(certified.agent, certified.kid, principal)

    def _claims(self, token: str, certified: Certified, now: float) -> dict[str, Any]:
        """The token's claims once its signature verifies with the certified key and they are
        complete, for this audience, and current (what jwt.decode checked, minus re-parsing
        the header)."""
        header, _, rest = token.partition(".")
        payload, _, signature = rest.partition(".")
        try:
            raw = _b64(signature)
            valid = _es256().verify(f"{header}.{payload}".encode("ascii"), certified.key, raw)
            claims = json.loads(_b64(payload)) if valid else None
        except (ValueError, binascii.Error, UnicodeError):
            valid, claims = False, None
        if not valid:
            raise PeerRefused("the call token does not verify (Signature verification failed)")
        if not isinstance(claims, dict) or any(k not in claims for k in _REQUIRED):
            raise PeerRefused(f"the call token does not verify (it needs {', '.join(_REQUIRED)})")
        exp, iat = claims["exp"], claims["iat"]
        if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in (exp, iat)):
            raise PeerRefused("the call token does not verify (exp and iat must be numbers)")
        if exp + _LEEWAY_S <= now:
            raise PeerRefused(f"the call token of {certified.agent!r} has expired")
        if iat > now + _LEEWAY_S:
            raise PeerRefused("the call token does not verify (issued in the future)")
        if claims["aud"] != self.audience:
            raise PeerRefused(
                f"the call token of {certified.agent!r} is for another agent, not {self.audience!r}"
            )
        return claims

    def _header(self, token: str, now: float) -> Certified:
        """The certified key a token's header names, checked (and remembered by header)."""
        import jwt  # with keys only (see _es256)

        try:
            header = jwt.get_unverified_header(token)
        except jwt.exceptions.PyJWTError:
            raise PeerRefused("not a mesh call token (a JWT)") from None
        certificate = header.get("mesh_cert")
        if (
            header.get("typ") != CALL_TOKEN_TYPE
            or header.get("alg") != ALGORITHM
            or not isinstance(certificate, str)
        ):
            raise PeerRefused("not a mesh call token")
        certified = self._certified(certificate, now)
        if header.get("kid") != certified.kid:
            raise PeerRefused("the token's key is not the one its certificate certifies")
        if len(self._headers) >= _MAX_CERTS:
            self._headers.pop(next(iter(self._headers)))
        self._headers[token.partition(".")[0]] = certified
        return certified

    def _certified(self, certificate: str, now: float) -> Certified:
        found = self._certs.get(certificate)
        if found is None:
            found = self.root.check(certificate, now=now)
            if len(self._certs) >= _MAX_CERTS:
                self._certs.pop(next(iter(self._certs)))
            self._certs[certificate] = found
        elif found.expires_at <= now:
            raise PeerRefused(f"the certificate of {found.agent!r} has expired")
        return found

    def _forget_expired(self, now: float) -> None:
        while self._seen:
            jti, until = next(iter(self._seen.items()))
            if until > now:
                return
            del self._seen[jti]


def _b64(segment: str) -> bytes:
    """A base64url segment (no padding) decoded strictly: other characters are an error."""
    return base64.b64decode(segment + "=" * (-len(segment) % 4), altchars=b"-_", validate=True)
