"""TLS: the certificate a process serves HTTPS with, and the CA bundle it verifies peers with.

    MESH_TLS_CERT / --tls-cert   PEM certificate (chain) a node or the registry serves
    MESH_TLS_KEY  / --tls-key    its private key (PEM)
    MESH_TLS_CA                  PEM bundle of the CAs whose certificates this process trusts
                                 when it calls out (unset: the system's trust store)

``client_context()`` is the one place mesh builds the ``ssl.SSLContext`` of its outbound clients:
a node's delegations and card reads, its registrar and discovery lookups, the registry's probes,
card fetches and console gathering, and the CLI all verify through it. Each entry point (``mesh
serve``, the ``mesh`` CLI, the registry) calls ``trust(ca_file)`` once, as it reads its settings;
a script that never does gets the system's trust store. One context per CA bundle is built and
shared: building one reads the bundle (milliseconds for the system store), verifying with it is
what OpenSSL does per handshake anyway.

``ServerTLS`` is the serving half: checked when the settings are built (both files, readable, a
key that matches the certificate), handed to uvicorn as its ``ssl_certfile`` and ``ssl_keyfile``.
"""

from __future__ import annotations

import functools
import ssl
from dataclasses import dataclass
from pathlib import Path

from mesh._errors import ConfigError

__all__ = [
    "ServerTLS",
    "client_context",
    "describe_failure",
    "trust",
    "trusted_ca",
    "verify_failure",
]


@dataclass(frozen=True)
class ServerTLS:
    """The certificate and key a process serves HTTPS with (paths; the key is never read
    into anything but the server's own context)."""

    cert_file: Path
    key_file: Path

    @classmethod
    def of(
        cls, cert: str | Path | None, key: str | Path | None, *, names: tuple[str, str]
    ) -> ServerTLS | None:
        """``ServerTLS`` when both files are given, None when neither is; a ``ConfigError``
        naming the setting (``names``: how the operator wrote the two) when only one is, a file
        is missing, or the key does not match the certificate."""
        if cert is None and key is None:
            return None
        if cert is None or key is None:
            given, missing = (names[0], names[1]) if cert is not None else (names[1], names[0])
            raise ConfigError(
                f"{given} is set without {missing}: HTTPS needs both the certificate and its "
                "private key (PEM files), or neither"
            )
        tls = cls(Path(cert), Path(key))
        for path, name in ((tls.cert_file, names[0]), (tls.key_file, names[1])):
            if not path.is_file():
                raise ConfigError(f"{name} {str(path)!r}: no such file; name a PEM file")
        try:
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(
                tls.cert_file, tls.key_file
            )
        except (ssl.SSLError, ValueError) as exc:
            raise ConfigError(
                f"{names[0]} / {names[1]}: cannot serve with this certificate and key ({exc}); "
                "give a PEM certificate and the private key it was issued for"
            ) from None
        return tls


_trusted: Path | None = None


def trust(ca_file: Path | None) -> None:
    """Verify every outbound HTTPS connection of this process against ``ca_file`` (a PEM
    bundle), or the system's trust store when None. An entry point calls it once, from its
    settings (``MESH_TLS_CA``), before it builds any client."""
    global _trusted
    _trusted = ca_file


def trusted_ca() -> Path | None:
    """The CA bundle ``trust`` was given (None: the system's trust store)."""
    return _trusted


def client_context() -> ssl.SSLContext:
    """The ``ssl.SSLContext`` every outbound client of mesh verifies with: certificates and
    host names checked, against the bundle given to ``trust`` or the system's trust store."""
    return _context(_trusted)


@functools.cache
def _context(ca_file: Path | None) -> ssl.SSLContext:
    try:
        # cafile given: only those CAs (a private mesh CA is the whole point); else OpenSSL's
        # default paths, the system's store (httpx's default would be certifi's bundle).
        return ssl.create_default_context(cafile=str(ca_file) if ca_file is not None else None)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"MESH_TLS_CA {str(ca_file)!r}: not a PEM bundle of CA certificates ({exc})"
        ) from None


def verify_failure(exc: BaseException | None) -> ssl.SSLCertVerificationError | None:
    """The certificate verification error behind ``exc`` (httpx and the a2a-sdk wrap it), if
    a failed TLS verification is why it was raised."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, ssl.SSLCertVerificationError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def describe_failure(url: str, error: ssl.SSLCertVerificationError) -> str:
    """What to tell an operator whose call to ``url`` failed TLS verification."""
    why = error.verify_message or error.reason or str(error)
    where = (
        f"the CA bundle MESH_TLS_CA names ({_trusted})"
        if _trusted is not None
        else "the system's trust store (set MESH_TLS_CA to the mesh's CA bundle)"
    )
    return (
        f"TLS verification of {url} failed ({why}): its certificate is not one {where} "
        "vouches for; nothing was sent to it"
    )
