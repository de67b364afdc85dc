"""Signed agent cards: A2A 1.0 ``signatures``, made and checked with a2a-sdk's helpers.

A node with keys (``mesh._keys.AgentKeys``) signs its card: a JWS (ES256) over the card's JCS
canonical form without its signatures (``a2a.utils.signing``), protected header ``{"alg":
"ES256", "typ": "JOSE", "kid": <the agent key's thumbprint>}``, and in the signature's
unprotected header ``mesh_cert``: the root's certificate of that key. So a verifier needs only
the mesh's root (``mesh._keys.TrustRoot``): the certificate gives the key and the agent name it
belongs to, the key checks the card.

``verify_card`` accepts a card only when one of its signatures carries a certificate of this
root and verifies with the key it certifies, and the card's name is the certified agent's.
Anything else is ``PeerRefused`` naming why (unsigned, another mesh's root, altered after
signing, expired, signed for another agent): the registry answers it as a 4xx, a caller logs it
and sends nothing.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

from a2a.types import AgentCard
from a2a.utils.signing import (
    SignatureVerificationError,
    create_agent_card_signer,
    create_signature_verifier,
)
from google.protobuf.json_format import MessageToDict
from jwt.exceptions import InvalidKeyError

from mesh._a2a.card import card_from_dict
from mesh._errors import PeerRefused
from mesh._keys import ALGORITHM, AgentKeys, TrustRoot

__all__ = ["CERT_HEADER", "CardSigner", "verify_card"]

#: The unprotected JWS header member holding the root's certificate of the signing key.
CERT_HEADER = "mesh_cert"
# Signatures looked at per card (a card may carry others' too; the rest are not read).
_MAX_SIGNATURES = 4


class CardSigner:
    """Signs cards with one agent's key (``sign``); the card route signs each card it builds
    once, and serves the signed bytes from then on."""

    def __init__(self, keys: AgentKeys) -> None:
        self.agent = keys.agent
        self.kid = keys.kid
        self._sign = create_agent_card_signer(
            keys.key,  # type: ignore[arg-type]  # PyJWT takes a cryptography key too
            {"alg": ALGORITHM, "typ": "JOSE", "kid": keys.kid},  # type: ignore[typeddict-item]
            header={CERT_HEADER: keys.certificate},
        )

    def __repr__(self) -> str:
        return f"CardSigner(agent={self.agent!r}, kid={self.kid!r})"

    def sign(self, card: AgentCard) -> AgentCard:
        """A copy of ``card`` with this agent's signature added."""
        signed = AgentCard()
        signed.CopyFrom(card)
        result: AgentCard = self._sign(signed)
        return result


def verify_card(card: AgentCard | Mapping[str, Any], root: TrustRoot) -> str:
    """The agent ``card`` is signed by, under ``root``; ``PeerRefused`` saying why not.

    The card's JSON (as served, or as ``card_to_dict`` gives it) or the parsed card."""
    if not isinstance(card, AgentCard):
        try:
            card = card_from_dict(dict(card))
        except Exception as exc:  # protobuf's ParseError: not a card at all
            raise PeerRefused("its agent card does not parse") from exc
    if not card.signatures:
        raise PeerRefused(
            "its agent card is not signed (a node signs it when it has keys: MESH_KEYS)"
        )
    reasons: list[str] = []
    for signature in list(card.signatures)[:_MAX_SIGNATURES]:
        header = MessageToDict(signature.header) if signature.HasField("header") else {}
        certificate = header.get(CERT_HEADER)
        if not isinstance(certificate, str):
            reasons.append("its agent card is signed without a mesh certificate")
            continue
        try:
            certified = root.check(certificate)
        except PeerRefused as exc:
            reasons.append(f"its agent card is signed, but {exc}")
            continue
        one = AgentCard()
        one.CopyFrom(card)
        del one.signatures[:]
        one.signatures.append(signature)

        def key_for(kid: str | None, _jku: str | None, certified: Any = certified) -> Any:
            if kid != certified.kid:
                raise InvalidKeyError("the signature's kid is not the certified key")
            return certified.key

        try:
            with warnings.catch_warnings():
                # The SDK warns about a card's missing required fields: a stranger's card may
                # lack anything, and that is the card's problem, not this process's.
                warnings.simplefilter("ignore")
                create_signature_verifier(key_for, [ALGORITHM])(one)
        except SignatureVerificationError:
            reasons.append(
                f"its agent card does not match its signature by {certified.agent!r} "
                "(altered after signing)"
            )
            continue
        if certified.agent != card.name:
            raise PeerRefused(
                f"its agent card names {card.name!r} but is signed by {certified.agent!r}'s "
                "certified key"
            )
        return certified.agent
    raise PeerRefused(reasons[0])
