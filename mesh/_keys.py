"""Mesh keys: the mesh's trust root, and per agent a key the root certifies.

    mesh keys init DIR            DIR/root.key.jwk  the root's private key (keep it offline)
                                  DIR/root.jwk      the root's public key (the trust root)
    mesh keys issue DIR AGENT     DIR/agents/AGENT/key.jwk   the agent's private key
                                  DIR/agents/AGENT/cert.jwt  its certificate (below)
                                  DIR/agents/AGENT/root.jwk  the trust root, to verify peers

Keys are EC P-256 JWKs (RFC 7517), signatures ES256. The **certificate** is a JWT (RFC 7519)
signed by the root's key: header ``{"alg": "ES256", "typ": "mesh-cert+jwt", "kid": <root
thumbprint>}``, claims ``sub`` (the agent's name), ``cnf.jwk`` (the agent's public key, RFC 7800's
proof-of-possession claim), ``iat`` and ``exp``. It binds one agent name to one public key, and a
verifier needs only the root's public key to check it: no certificate store, no X.509 and no
network. A key's ``kid`` is its RFC 7638 thumbprint. Every file is written 0600 in a 0700
folder; a node is pointed at its folder (``MESH_KEYS`` / ``--keys``; the mesh's DIR works too: a
node takes ``agents/<its name>``), the registry at the root (``root.jwk`` in the folder it is
given). Nothing here ever prints, logs or returns a private key: reprs show thumbprints.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mesh._errors import ConfigError, PeerRefused

# PyJWT and cryptography (~0.1 s to import) are imported where keys are used: a node without
# keys never loads them (tests/test_import_cost.py).
if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric import ec

__all__ = [
    "AGENT_FOLDER",
    "ALGORITHM",
    "CERT_TYPE",
    "AgentKeys",
    "Certified",
    "TrustRoot",
    "init_mesh",
    "issue_agent",
    "thumbprint",
]

ALGORITHM = "ES256"
CERT_TYPE = "mesh-cert+jwt"
ROOT_PRIVATE = "root.key.jwk"
ROOT_PUBLIC = "root.jwk"
AGENT_KEY = "key.jwk"
AGENT_CERT = "cert.jwt"
AGENT_FOLDER = "agents"
#: Days an agent certificate lasts unless ``mesh keys issue --days`` says otherwise.
DEFAULT_DAYS = 365
# The agent names mesh.Agent accepts (they become folder names here).
_AGENT = re.compile(r"^[a-z][a-z0-9-]{0,62}$")


def thumbprint(jwk: dict[str, Any]) -> str:
    """The RFC 7638 thumbprint of an EC public JWK (base64url SHA-256, no padding)."""
    members = {k: jwk[k] for k in ("crv", "kty", "x", "y")}
    digest = hashlib.sha256(json.dumps(members, separators=(",", ":"), sort_keys=True).encode())
    return base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode()


def _public_jwk(key: ec.EllipticCurvePrivateKey | ec.EllipticCurvePublicKey) -> dict[str, Any]:
    from cryptography.hazmat.primitives.asymmetric import ec
    from jwt.algorithms import ECAlgorithm

    public = key.public_key() if isinstance(key, ec.EllipticCurvePrivateKey) else key
    jwk: dict[str, Any] = ECAlgorithm.to_jwk(public, as_dict=True)
    jwk = {k: jwk[k] for k in ("kty", "crv", "x", "y")}
    return {**jwk, "kid": thumbprint(jwk), "alg": ALGORITHM, "use": "sig"}


def _private_jwk(key: ec.EllipticCurvePrivateKey) -> dict[str, Any]:
    from jwt.algorithms import ECAlgorithm

    jwk: dict[str, Any] = ECAlgorithm.to_jwk(key, as_dict=True)
    return {**_public_jwk(key), "d": jwk["d"]}


def _write(path: Path, data: str) -> None:
    """Write ``data`` to a new file created 0600 (never readable by others, not even briefly)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(data)
    os.replace(tmp, path)


def _read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"no {what} at {path}: create it with `mesh keys init`") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read the {what} at {path}: {exc.__class__.__name__}") from None
    if not isinstance(data, dict) or data.get("kty") != "EC" or data.get("crv") != "P-256":
        raise ConfigError(f"{path} is not an EC P-256 JWK (the {what}); see `mesh keys init`")
    return data


def _private_key(jwk: dict[str, Any], path: Path) -> ec.EllipticCurvePrivateKey:
    import jwt
    from cryptography.hazmat.primitives.asymmetric import ec
    from jwt.algorithms import ECAlgorithm

    try:
        key = ECAlgorithm.from_jwk(jwk)
    except jwt.exceptions.PyJWTError as exc:
        raise ConfigError(f"{path} does not hold a usable EC key ({exc})") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ConfigError(f"{path} holds a public key where the private key should be")
    return key


def init_mesh(folder: Path) -> str:
    """Create the mesh's trust root in ``folder``; its thumbprint. ``ConfigError`` when one is
    there already (a new root would orphan every certificate it issued)."""
    from cryptography.hazmat.primitives.asymmetric import ec

    if (folder / ROOT_PRIVATE).exists() or (folder / ROOT_PUBLIC).exists():
        raise ConfigError(
            f"{folder} already holds a mesh root ({ROOT_PUBLIC}); a new root would invalidate "
            "every agent certificate issued by this one: use another folder, or remove it first"
        )
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = ec.generate_private_key(ec.SECP256R1())
    _write(folder / ROOT_PRIVATE, json.dumps(_private_jwk(key), indent=2) + "\n")
    public = _public_jwk(key)
    _write(folder / ROOT_PUBLIC, json.dumps(public, indent=2) + "\n")
    return str(public["kid"])


def issue_agent(folder: Path, agent: str, *, days: int = DEFAULT_DAYS) -> Path:
    """A new key for ``agent``, certified by the root in ``folder``, written to
    ``folder/agents/<agent>/`` (replacing an older one: that is how a key is rotated). The
    folder to mount on the agent's node."""
    import jwt
    from cryptography.hazmat.primitives.asymmetric import ec

    if not _AGENT.match(agent):
        raise ConfigError(
            f"{agent!r} is not an agent name: lowercase letters, digits and '-', starting "
            "with a letter (the name the agent's card has)"
        )
    if days < 1:
        raise ConfigError(f"--days {days}: give at least 1")
    root_path = folder / ROOT_PRIVATE
    root_jwk = _read_json(root_path, "mesh root's private key")
    root_key = _private_key(root_jwk, root_path)
    key = ec.generate_private_key(ec.SECP256R1())
    public = _public_jwk(key)
    now = int(time.time())
    root_public = _public_jwk(root_key)
    cert = jwt.encode(
        {"sub": agent, "cnf": {"jwk": public}, "iat": now, "exp": now + days * 86400},
        root_key,
        algorithm=ALGORITHM,
        headers={"typ": CERT_TYPE, "kid": root_public["kid"]},
    )
    out = folder / AGENT_FOLDER / agent
    out.mkdir(parents=True, exist_ok=True, mode=0o700)
    _write(out / AGENT_KEY, json.dumps(_private_jwk(key), indent=2) + "\n")
    _write(out / AGENT_CERT, cert + "\n")
    _write(out / ROOT_PUBLIC, json.dumps(root_public, indent=2) + "\n")
    return out


@dataclass(frozen=True)
class Certified:
    """What a valid certificate says: ``agent`` holds the key ``kid`` (``key``, public)."""

    agent: str
    kid: str
    key: ec.EllipticCurvePublicKey = field(repr=False)
    expires_at: int


@dataclass(frozen=True)
class TrustRoot:
    """The mesh's root public key: what verifies agent certificates (and through them cards)."""

    kid: str
    key: ec.EllipticCurvePublicKey = field(repr=False)

    @classmethod
    def load(cls, where: Path) -> TrustRoot:
        """The root in ``where``: a ``root.jwk`` file, or a folder holding one (the mesh's
        folder or an agent's). ``ConfigError`` says what is missing."""
        import jwt
        from cryptography.hazmat.primitives.asymmetric import ec
        from jwt.algorithms import ECAlgorithm

        path = where / ROOT_PUBLIC if where.is_dir() else where
        jwk = _read_json(path, "mesh root's public key")
        try:
            key = ECAlgorithm.from_jwk({k: jwk[k] for k in ("kty", "crv", "x", "y")})
        except (KeyError, jwt.exceptions.PyJWTError) as exc:
            raise ConfigError(f"{path} does not hold a usable EC public key ({exc})") from None
        if isinstance(key, ec.EllipticCurvePrivateKey):
            key = key.public_key()
        return cls(thumbprint(jwk), key)

    def check(self, certificate: str, *, now: float | None = None) -> Certified:
        """The agent and key ``certificate`` binds, if this root signed it and it has not
        expired; else ``PeerRefused`` whose message is the reason (a log or a 4xx carries it)."""
        import jwt
        from cryptography.hazmat.primitives.asymmetric import ec
        from jwt.algorithms import ECAlgorithm

        try:
            header = jwt.get_unverified_header(certificate)
        except jwt.exceptions.PyJWTError:
            raise PeerRefused("its certificate is not a JWT") from None
        if header.get("typ") != CERT_TYPE:
            raise PeerRefused("its certificate is not a mesh agent certificate")
        if header.get("kid") != self.kid:
            raise PeerRefused("its certificate is signed by another mesh's root")
        try:
            claims = jwt.decode(
                certificate,
                self.key,
                algorithms=[ALGORITHM],
                options={"require": ["sub", "exp", "cnf"], "verify_exp": False},
            )
        except jwt.exceptions.PyJWTError:
            raise PeerRefused(
                "its certificate is not signed by this mesh's root (forged or altered)"
            ) from None
        expires = int(claims["exp"])
        if expires <= (time.time() if now is None else now):
            raise PeerRefused(
                f"its certificate for {claims['sub']!r} expired; issue a new one with "
                "`mesh keys issue`"
            )
        jwk = claims["cnf"].get("jwk") if isinstance(claims["cnf"], dict) else None
        try:
            key = ECAlgorithm.from_jwk({k: jwk[k] for k in ("kty", "crv", "x", "y")})  # type: ignore[index]
        except (KeyError, TypeError, jwt.exceptions.PyJWTError):
            raise PeerRefused("its certificate holds no usable key") from None
        if not isinstance(key, ec.EllipticCurvePublicKey):
            raise PeerRefused("its certificate holds no usable key")
        return Certified(str(claims["sub"]), thumbprint(jwk), key, expires)  # type: ignore[arg-type]


@dataclass(frozen=True)
class AgentKeys:
    """One agent's key material: its private key, the root's certificate of it, and the root
    (to verify peers). The repr names thumbprints only."""

    agent: str
    kid: str
    key: ec.EllipticCurvePrivateKey = field(repr=False)
    certificate: str = field(repr=False)
    root: TrustRoot

    @classmethod
    def load(cls, where: Path, agent: str) -> AgentKeys:
        """``agent``'s keys from ``where``: its folder (``key.jwk``, ``cert.jwt``, ``root.jwk``)
        or the mesh's folder (``agents/<agent>/``). ``ConfigError`` when a file is missing, the
        certificate is for another agent or key, or the root did not sign it."""
        if not where.is_dir():
            raise ConfigError(
                f"MESH_KEYS={str(where)!r}: no such folder; give the folder `mesh keys issue` "
                "wrote for this agent"
            )
        folder = where
        if not (where / AGENT_KEY).exists() and (where / AGENT_FOLDER / agent).is_dir():
            folder = where / AGENT_FOLDER / agent
        key_path = folder / AGENT_KEY
        if not key_path.exists():
            raise ConfigError(
                f"no key for {agent!r} in {where}: run `mesh keys issue {where} {agent}` "
                "and point MESH_KEYS at the folder it prints"
            )
        key = _private_key(_read_json(key_path, f"key of {agent!r}"), key_path)
        try:
            certificate = (folder / AGENT_CERT).read_text().strip()
        except OSError:
            raise ConfigError(f"no certificate ({AGENT_CERT}) beside {key_path}") from None
        root = TrustRoot.load(folder)
        try:
            certified = root.check(certificate)
        except PeerRefused as exc:
            raise ConfigError(f"{folder / AGENT_CERT}: {exc}") from None
        kid = thumbprint(_public_jwk(key))
        if certified.agent != agent:
            raise ConfigError(
                f"{folder / AGENT_CERT} certifies {certified.agent!r}, not {agent!r}: point "
                f"MESH_KEYS at this agent's folder (`mesh keys issue DIR {agent}`)"
            )
        if certified.kid != kid:
            raise ConfigError(
                f"{folder / AGENT_CERT} certifies another key than {key_path}: issue them "
                "again together"
            )
        return cls(agent, kid, key, certificate, root)
