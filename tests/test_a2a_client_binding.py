"""``A2APeer.send`` picks its binding by the card it holds now: a peer's card read again (the
node at that address changed) decides the next send, whatever the one before said."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import httpx
import pytest
from a2a.types import AgentCard

from mesh._a2a.client import A2APeer
from mesh._errors import RemoteError
from tests.support import free_port, running

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def rest_only(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An a2a-sdk node whose card offers HTTP+JSON only (tests.rest_only_node)."""
    tmp = tmp_path_factory.mktemp("rest-only")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "tests.rest_only_node", "--port", str(port)]
    with running(argv, name="rest-only", tmp=tmp, health=url + "/health"):
        yield url


async def test_the_binding_follows_the_card_read_again(rest_only: str) -> None:
    async with httpx.AsyncClient(timeout=30.0, trust_env=False) as http:
        reader = A2APeer(http, rest_only)
        rest_card = await reader.card()
        # A card saying JSON-RPC, as the node at this address once served.
        said_json_rpc = AgentCard()
        said_json_rpc.CopyFrom(rest_card)
        for interface in said_json_rpc.supported_interfaces:
            interface.protocol_binding = "JSONRPC"
        peer = A2APeer(http, rest_only, card=said_json_rpc)
        with pytest.raises(RemoteError):
            await peer.send({"text": "first"}, skill="echo")  # JSON-RPC: nothing there
        await peer.fetch_card_dict()  # the card as it is now: HTTP+JSON only
        result = await peer.send({"text": "then"}, skill="echo")
        assert result.state == "completed", result
        assert result.data == {"echo": "then"}
        await reader.aclose()
        await peer.aclose()
