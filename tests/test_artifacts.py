"""``mesh.File``, ``attach`` and the skill options of the output side, in process: what a
developer gets wrong fails when the module is imported or the call is made, saying what to do;
a turn's tools' attachments come back from ``Runner.run``."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from mesh import Agent, Artifact, Call, ConfigError, File, Rule, Runner, Script, SkillContext, skill
from mesh._tools import ToolContext


class In(BaseModel):
    x: int


class Out(BaseModel):
    y: int


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({}, r"either data \(bytes\) or url"),
        ({"data": b"x", "url": "https://a.example/x"}, "not both"),
        ({"data": "text"}, "takes bytes"),
        ({"url": "file:///etc/passwd"}, r"an http\(s\) URL"),
        ({"data": b"x", "media_type": "png"}, "MIME type"),
    ],
)
def test_a_file_says_what_is_wrong(kwargs: dict[str, object], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        File(**kwargs)  # type: ignore[arg-type]


def test_attach_names_artifacts_and_refuses_what_is_not_a_part() -> None:
    ctx = SkillContext(skill_id="s")
    png = File(b"\x89PNG", media_type="image/png", name="a.png")
    assert ctx.attach(png).name == "a.png"
    assert ctx.attach({"k": 1}, "text").name == "attachment-2"
    assert ctx.attach(Out(y=3), name="out").parts == ({"y": 3},)
    with pytest.raises(ConfigError, match="at least one part"):
        ctx.attach()
    with pytest.raises(ConfigError, match="got int"):
        ctx.attach(3)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"reply": "message", "asks": True}, "reply='message'"),
        ({"reply": "message", "long_running": True}, "reply='message'"),
        ({"reply": "envelope"}, "reply is 'task' or 'message'"),
        ({"accepts": ["png"]}, "media types"),
    ],
)
def test_skill_options_are_checked_at_import(options: dict[str, object], says: str) -> None:
    def handler(req: In, ctx: SkillContext) -> Out:
        return Out(y=req.x)

    with pytest.raises(ConfigError, match=says):
        skill(**options)(handler)


def test_input_modes_are_what_the_card_lists() -> None:
    @skill(accepts=["image/*"])
    def scan(req: In, ctx: SkillContext) -> Out:
        "Scan."
        return Out(y=len(ctx.files))

    assert scan.input_modes == ["application/json", "text/plain", "image/*"]
    assert scan.output_modes == ["application/json", "text/plain"]


async def test_runner_returns_what_the_turns_tools_attached() -> None:
    def export(ctx: ToolContext) -> dict[str, int]:
        "Export."
        ctx.attach(File(b"a,b", media_type="text/csv", name="x.csv"))
        return {"rows": 1}

    agent = Agent(
        name="exporter",
        instruction="Export.",
        tools=[export],
        script=Script(rules=[Rule(when="export", steps=[Call("export")], answer="done")]),
    )
    runner = Runner(agent, env={})
    result = await runner.run(user_id="u", session_id=None, message="export")
    assert result.text == "done"
    assert result.artifacts == [
        Artifact(name="x.csv", parts=(File(b"a,b", media_type="text/csv", name="x.csv"),))
    ]
    # The tools' view of the turn's metadata stays the caller's.
    assert "attachments" not in result.events[0].metadata


def test_media_types_match_like_the_card_says() -> None:
    from a2a.helpers import new_data_part, new_text_part
    from a2a.types import Part

    from mesh._a2a.artifacts import media_type, refused_types

    typed = ["application/json", "text/plain", "image/*"]
    parts = [
        new_data_part({"a": 1}),
        new_text_part("hi"),
        Part(text="# md", media_type="text/markdown; charset=utf-8"),
        Part(data=new_data_part({}).data, media_type="application/vnd.mesh+json"),
        Part(raw=b"x", media_type="IMAGE/PNG"),
    ]
    assert refused_types({media_type(p) for p in parts}, typed) == []
    assert media_type(Part(raw=b"x")) == "application/octet-stream"
    assert refused_types({"application/pdf", "image/png"}, typed) == ["application/pdf"]
    assert refused_types({"application/json"}, ["text/plain"]) == ["application/json"]
