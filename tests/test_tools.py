"""Tools: schemas from type hints, argument validation, context injection, result shaping."""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Mapping
from typing import Annotated, Any, Literal

import pytest
from pydantic import BaseModel, Field

from mesh._errors import ConfigError, ToolError
from mesh._tools import (
    FunctionTool,
    Tool,
    ToolContext,
    as_tool,
    current_context,
    invoke_tool,
    tool,
)


class Address(BaseModel):
    city: str
    postcode: str | None = None


class Applicant(BaseModel):
    name: str
    address: Address


@tool
async def register(
    applicant: Applicant,
    kind: Literal["personal", "mortgage"],
    note: str | None,
    tags: list[str],
    amount: Annotated[float, Field(description="Requested amount in EUR", gt=0)],
    ctx: ToolContext,
    term_months: int = 12,
) -> dict[str, Any]:
    """Register a loan application.

    Returns the stored application.
    """
    return {"applicant": applicant.name, "city": applicant.address.city, "term": term_months}


def test_schema_from_type_hints() -> None:
    schema = register.parameters
    props = schema["properties"]
    assert schema["type"] == "object"
    assert set(props) == {"applicant", "kind", "note", "tags", "amount", "term_months"}
    # ToolContext is injected, never shown to the model.
    assert "ctx" not in props
    assert sorted(schema["required"]) == ["amount", "applicant", "kind", "note", "tags"]
    # Nested pydantic models are inlined: a self-contained schema, no $ref/$defs, no titles.
    assert "$defs" not in schema
    assert "$ref" not in str(schema)
    assert "title" not in str(schema)
    assert props["applicant"]["properties"]["address"]["properties"]["city"] == {"type": "string"}
    assert props["applicant"]["required"] == ["name", "address"]
    assert props["kind"] == {"enum": ["personal", "mortgage"], "type": "string"}
    assert {"type": "null"} in props["note"]["anyOf"]
    assert props["tags"] == {"items": {"type": "string"}, "type": "array"}
    assert props["amount"]["description"] == "Requested amount in EUR"
    assert props["amount"]["exclusiveMinimum"] == 0
    assert props["term_months"] == {"default": 12, "type": "integer"}


def test_description_from_docstring_and_overrides() -> None:
    assert register.name == "register"
    assert register.description.startswith("Register a loan application.")
    assert "Returns the stored application." in register.description

    @tool(name="lookup", description="Find an applicant.")
    def find(applicant_id: str) -> str:
        """Not this."""
        return applicant_id

    assert (find.name, find.description) == ("lookup", "Find an applicant.")
    # Still callable as the function it wraps.
    assert find("APP-1") == "APP-1"


def test_a_property_named_title_survives_schema_cleaning() -> None:
    @tool
    def rename(title: str, properties: int = 0) -> None:
        """Rename."""

    assert set(rename.parameters["properties"]) == {"title", "properties"}


def test_as_tool_normalises_functions_and_passes_tools_through() -> None:
    def plain(x: int) -> int:
        """Double x."""
        return 2 * x

    t = as_tool(plain)
    assert isinstance(t, FunctionTool)
    assert isinstance(t, Tool)
    assert as_tool(t) is t
    with pytest.raises(ConfigError, match="not a tool"):
        as_tool(42)
    with pytest.raises(ConfigError, match="name"):
        as_tool(lambda x: x)


async def test_call_validates_leniently_and_injects_context() -> None:
    seen: dict[str, Any] = {}

    @tool
    async def take(count: int, applicant: Applicant, ctx: ToolContext) -> str:
        """Take."""
        seen.update(count=count, applicant=applicant, ctx=ctx)
        return "ok"

    ctx = ToolContext(agent_name="a", user_id="u", session_id="s", invocation_id="i")
    args = {"count": 3.0, "applicant": {"name": "Ann", "address": {"city": "Oslo"}}}
    assert await take.call(args, ctx) == "ok"
    assert seen["count"] == 3
    assert isinstance(seen["count"], int)
    assert isinstance(seen["applicant"], Applicant)
    assert seen["applicant"].address.city == "Oslo"
    assert seen["ctx"] is ctx


async def test_invalid_arguments_become_a_structured_error_naming_the_field() -> None:
    result = await invoke_tool(
        register,
        {
            "applicant": {"name": "Ann", "address": {}},
            "kind": "car",
            "note": None,
            "tags": [],
            "amount": 5,
        },
        ToolContext(),
    )
    error = result["error"]
    assert error["type"] == "invalid_arguments"
    fields = {d["field"] for d in error["details"]}
    assert fields == {"applicant.address.city", "kind"}
    assert "applicant.address.city" in error["message"]
    assert "kind" in error["message"]


async def test_sync_tools_run_in_a_thread_and_see_the_context() -> None:
    @tool
    def where(ctx: ToolContext) -> dict[str, Any]:
        """Where am I."""
        current = current_context()
        return {
            "main": threading.current_thread() is threading.main_thread(),
            "same_ctx": current is ctx,
        }

    result = await invoke_tool(where, {}, ToolContext(session_id="s1"))
    assert result == {"result": {"main": False, "same_ctx": True}}


async def test_raising_tools_return_errors_instead_of_failing() -> None:
    @tool
    async def broken(x: int) -> int:
        """Broken."""
        raise ValueError(f"bad x {x}")

    @tool
    async def refusing() -> None:
        """Refuses politely."""
        raise ToolError("applicant not found", kind="not_found", details={"id": "APP-9"})

    assert await invoke_tool(broken, {"x": 1}, ToolContext()) == {
        "error": {"type": "ValueError", "message": "bad x 1"}
    }
    assert await invoke_tool(refusing, {}, ToolContext()) == {
        "error": {"type": "not_found", "message": "applicant not found", "details": {"id": "APP-9"}}
    }


async def test_results_are_wrapped_and_json_able() -> None:
    class Report(BaseModel):
        score: int
        at: dt.date

    @tool
    async def report() -> Report:
        """Report."""
        return Report(score=700, at=dt.date(2024, 5, 1))

    @tool
    async def pair() -> tuple[int, dt.datetime]:
        """Pair."""
        return 1, dt.datetime(2024, 5, 1, 12, 0)

    assert await invoke_tool(report, {}, ToolContext()) == {
        "result": {"score": 700, "at": "2024-05-01"}
    }
    assert await invoke_tool(pair, {}, ToolContext()) == {"result": [1, "2024-05-01T12:00:00"]}


def test_state_view_reads_session_state_under_pending_writes() -> None:
    ctx = ToolContext(session_state={"a": 1, "b": 2})
    ctx.state_delta["b"] = None
    ctx.state_delta["c"] = 3
    assert dict(ctx.state) == {"a": 1, "b": None, "c": 3}
    assert len(ctx.state) == 3
    with pytest.raises(TypeError):
        ctx.state["a"] = 5  # type: ignore[index]


def test_unresolvable_hints_are_a_config_error() -> None:
    def odd(x: NotDefinedAnywhere) -> None:  # type: ignore[name-defined]  # noqa: F821
        """Odd."""

    with pytest.raises(ConfigError, match="odd"):
        tool(odd)


async def test_parameter_names_may_clash_with_basemodel_attributes() -> None:
    @tool
    async def query(schema: str, model_name: str = "m", json: bool = False) -> list[Any]:
        """Query."""
        return [schema, model_name, json]

    assert set(query.parameters["properties"]) == {"schema", "model_name", "json"}
    assert query.parameters["required"] == ["schema"]
    assert await invoke_tool(query, {"schema": "s", "json": True}, ToolContext()) == {
        "result": ["s", "m", True]
    }
    missing = await invoke_tool(query, {}, ToolContext())
    assert [d["field"] for d in missing["error"]["details"]] == ["schema"]


class _Missing(dict):  # type: ignore[type-arg]
    def __missing__(self, key: str) -> str:
        return f"missing {key}"


class _Plain(Mapping[str, Any]):  # a Mapping that is no dict
    def __init__(self, data: dict[str, Any]) -> None:
        self._data = data

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Any:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)


@pytest.mark.parametrize(
    "base", [{"a": 1, "b": None}, _Missing(a=1, b=None), _Plain({"a": 1, "b": None})]
)
def test_a_state_views_get_is_mappings(base: Any) -> None:
    """``StateView.get`` answers as ``Mapping.get`` (its ``__getitem__`` in a try): the delta
    first, then the base, its ``__missing__`` included, the default for neither."""
    from mesh._tools import StateView

    view = StateView(base, {"b": 2, "c": None})
    for key in ("a", "b", "c", "d"):
        for default in (None, 0, "x"):
            assert view.get(key, default) == Mapping.get(view, key, default)
        assert view.get(key) == Mapping.get(view, key)


def test_a_state_views_get_of_an_absent_key_raises_nothing() -> None:
    """A key in neither the delta nor a dict base (a delegation's first call to a peer reads
    its context id) is the default without a KeyError made and caught."""
    import sys

    from mesh._tools import StateView

    raised: list[str] = []

    def trace(frame: Any, event: str, arg: Any) -> Any:
        if event == "exception":
            raised.append(frame.f_code.co_name)
        return trace

    view = StateView({"a": 1}, {"b": 2})
    sys.settrace(trace)
    try:
        found = view.get("mesh.ctx.peer")
    finally:
        sys.settrace(None)
    assert found is None
    assert raised == []
