"""``Delegation.run`` reads the peer's context id without making a ``StateView`` (session 38,
helper C2): ``_state_value(ctx, key)`` is ``ctx.state.get(key)`` for every session state and
pending write (the key in either, both or neither; any value, None included), a session state
that is not a dict, and a context of a subclass whose ``state`` is its own."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from mesh._delegation import _state_value, context_key
from mesh._tools import ToolContext

KEY = context_key("bureau")
keys = st.sampled_from([KEY, context_key("other"), "x"])
values = st.one_of(st.none(), st.text(max_size=5), st.integers(), st.just({"a": 1}))
states = st.dictionaries(keys, values, max_size=3)


class _OwnState(ToolContext):
    """A context whose ``state`` says something else: read through it, as before."""

    @property
    def state(self) -> Mapping[str, Any]:
        return {KEY: "its own"}


@given(states, states)
def test_the_value_the_state_view_gives(session: dict[str, Any], delta: dict[str, Any]) -> None:
    ctx = ToolContext(session_state=session, state_delta=delta)
    assert _state_value(ctx, KEY) == ctx.state.get(KEY)
    assert _state_value(ctx, KEY) is ctx.state.get(KEY)
    proxied = ToolContext(session_state=MappingProxyType(session), state_delta=delta)
    assert _state_value(proxied, KEY) is proxied.state.get(KEY)
    own = _OwnState(session_state=session, state_delta=delta)
    assert _state_value(own, KEY) == "its own"
