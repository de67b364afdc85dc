"""Fuzzing the live registry: no input gets a 5xx, bad ones get a 422 naming the field.

Two fuzzers against one real registry process:
- a hypothesis property test over registration bodies built around the values that used to be
  500s (ports out of range or not numbers, hosts IDNA cannot encode, CR/LF and NUL, long URLs,
  card paths with queries and dot segments, odd agent names and instance ids);
- schemathesis, reading the registry's /openapi.json and generating requests for every /v1
  route from it (schema-valid and schema-invalid), checking only that none answers 5xx.

Registration needs a reachable card, so most registrations end at validation or at the card
fetch: that is the surface under test. Every URL that could pass validation names a loopback
or an always-refused address (never a DNS name): tests talk to 127.0.0.1 only.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import not_a_server_error
from schemathesis.generation.modes import GenerationMode

from tests.registry_support import registry

pytestmark = pytest.mark.integration

# Per example: a registration answers in milliseconds; one that takes this long is hanging.
DEADLINE = timedelta(seconds=20)
BODY_FIELDS = {"instance_id", "url", "agent", "version", "card_path", "body"}


@pytest.fixture(scope="module")
def registry_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with registry(tmp_path_factory.mktemp("fuzzed")) as service:
        yield service.url


# -- hypothesis: registration bodies ------------------------------------------------------------

# Hosts that never reach a DNS server: addresses, localhost, and names the resolver refuses
# locally (IDNA errors). A random host would be a DNS query leaving the machine.
_HOSTS = st.sampled_from(
    [
        "127.0.0.1",
        "127.0.0.2",
        "localhost",
        "[::1]",
        "127.1",
        "169.254.169.254",
        "[::ffff:169.254.169.254]",
        "[fe80::1]",
        "0.0.0.0",
        "[zz]",
        "[::1",
        "xn--zz",
        "a..b",
        "",
        "user:pw@127.0.0.1",
        "127.0.0.1\r\nX-Evil: 1",
        "127.0.0.1\x00",
        "127.0.0.1 ",
    ]
)
_PORTS = st.one_of(
    st.just(""),
    st.integers(min_value=-5, max_value=200_000).map(lambda p: f":{p}"),
    # No '@': it would turn what follows into the host.
    st.text(st.characters(exclude_characters="@"), max_size=8).map(lambda t: f":{t}"),
)
_PATHS = st.one_of(
    st.just(""),
    st.text(max_size=40).map(lambda t: f"/{t}"),
    st.sampled_from(["/a/../b", "/./x", "/%2e%2e/", "/?q=1", "/#f", "/" + "a" * 3000]),
)
_URLS = st.one_of(
    st.builds(
        lambda scheme, host, port, path: f"{scheme}://{host}{port}{path}",
        st.sampled_from(["http", "https", "HTTP", "ftp", "javascript", ""]),
        _HOSTS,
        _PORTS,
        _PATHS,
    ),
    # Anything else, as long as it cannot be an http(s) URL with some host in it.
    st.text(max_size=60).filter(lambda t: "://" not in t),
    st.integers(),
    st.none(),
)
_CARD_PATHS = st.one_of(
    st.text(max_size=60).map(lambda t: f"/{t}"),
    st.text(max_size=60),
    st.sampled_from(
        ["/admin/delete-everything?confirm=yes", "/a/../b", "/a\r\nb", "/\x00", "/" + "a" * 300]
    ),
    st.integers(),
)
_AGENTS = st.one_of(st.from_regex(r"[a-z][a-z0-9-]{0,62}", fullmatch=True), st.text(max_size=80))
_INSTANCE_IDS = st.one_of(
    st.from_regex(r"[A-Za-z0-9._:-]{1,200}", fullmatch=True), st.text(max_size=250)
)


@st.composite
def _bodies(draw: st.DrawFn) -> dict[str, Any]:
    body = {
        "instance_id": draw(_INSTANCE_IDS),
        "url": draw(_URLS),
        "agent": draw(_AGENTS),
        "card_path": draw(_CARD_PATHS),
    }
    # Sometimes leave a field out (card_path has a default, the others are required).
    dropped = draw(st.sets(st.sampled_from(sorted(body)), max_size=1))
    return {k: v for k, v in body.items() if k not in dropped}


def test_registration_bodies_get_a_4xx_naming_the_field_never_a_500(registry_url: str) -> None:
    with httpx.Client(base_url=registry_url, timeout=15) as http:

        @given(body=_bodies())
        @settings(
            max_examples=250,
            deadline=DEADLINE,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def register(body: dict[str, Any]) -> None:
            r = http.post("/v1/instances", json=body)
            assert r.status_code < 500, (body, r.status_code, r.text)
            assert r.headers["content-type"].startswith("application/json"), r.text
            answer = r.json()
            if r.status_code == 422 and answer["error"] == "invalid_request":
                named = {f["field"].split(".")[0] for f in answer["fields"]}
                assert named, answer
                assert named <= BODY_FIELDS, answer
            elif r.status_code == 422:
                assert answer["error"] in {"invalid_card", "url_refused"}, answer

        register()


# -- schemathesis: every /v1 route from the published schema ---------------------------------

EXAMPLES = 30  # per operation and mode: the whole run stays well under a minute

# Swap the host of a generated URL for a loopback address (port, path and the rest stay as
# generated): the schema allows DNS names, and a test must not look them up.
_URL_HOST = re.compile(r"^([\x00-\x20]*https?://)([^/:\[\]]+|\[[^\]]*\])", re.IGNORECASE)


def _keep_on_loopback(body: Any) -> None:
    if isinstance(body, dict) and isinstance(body.get("url"), str):
        body["url"] = _URL_HOST.sub(r"\g<1>127.0.0.1", body["url"], count=1)


def _schema_states_the_rules(spec: dict[str, Any]) -> None:
    # Without them a schema-driven fuzzer generates no URL-shaped values at all, and the 500s
    # those caused stay unseen.
    body = spec["components"]["schemas"]["RegisterBody"]["properties"]
    for name in ("url", "card_path", "agent", "instance_id"):
        assert {"maxLength", "pattern"} <= set(body[name]), (name, body[name])
    assert re.search(body["url"]["pattern"], "http://127.0.0.1:8017")
    assert not re.search(body["url"]["pattern"], "http://127.0.0.1:8017/?q=1")
    assert re.search(body["card_path"]["pattern"], "/.well-known/agent-card.json")
    assert not re.search(body["card_path"]["pattern"], "/admin?confirm=yes")


# schemathesis's own pytest integration (lazy schemas from fixtures) does not run on pytest 9,
# so each operation's strategy is driven by hypothesis here: same generation, same check.
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_the_published_schema_finds_no_server_error(
    registry_url: str, mode: GenerationMode
) -> None:
    _schema_states_the_rules(httpx.get(f"{registry_url}/openapi.json").json())
    loaded = schemathesis.openapi.from_url(f"{registry_url}/openapi.json")
    operations = [r.ok() for r in loaded.include(path_regex="^/v1/").get_all_operations()]
    fuzzed = []
    for operation in operations:

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(
            max_examples=EXAMPLES,
            deadline=DEADLINE,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def call(case: Any) -> None:
            _keep_on_loopback(case.body)
            case.call_and_validate(checks=[not_a_server_error], timeout=15)

        try:
            call()
        except Unsatisfiable:
            # No schema-invalid input exists for an operation without inputs or with only
            # free strings (a path parameter): nothing to fuzz negatively there.
            if mode is GenerationMode.POSITIVE:
                raise
            continue
        fuzzed.append(f"{operation.method.upper()} {operation.path}")
    assert "POST /v1/instances" in fuzzed
