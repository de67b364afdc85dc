"""A skip reason says what to set to run the test, not what the author's machine lacked."""

from __future__ import annotations

import pytest

from tests import test_consul_backend, test_consul_store


@pytest.mark.parametrize("module", [test_consul_backend, test_consul_store])
def test_consul_skip_reason_says_what_to_set(module: object) -> None:
    reason = module.needs_consul.kwargs["reason"]  # type: ignore[attr-defined]
    assert "CONSUL_HTTP_ADDR=127.0.0.1:8500" in reason
    assert "consul agent -dev" in reason
    assert "here" not in reason
