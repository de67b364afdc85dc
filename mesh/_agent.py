"""``Agent``: plain configuration. It does no I/O; a ``Runner`` (or a node) executes it.

loan_officer = Agent(
    name="loan-officer",
    description="Decides personal-loan applications.",
    instruction="You are a careful loan officer...",
    model="gemini-2.5-flash",      # or a Model; no key configured -> the scripted model
    tools=[lookup_applicant],
    script=LOAN_SCRIPT,            # what the offline scripted model does
)
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mesh._errors import ConfigError
from mesh._skills import TEXT_SKILL_ID, Skill

if TYPE_CHECKING:
    from mesh._models.base import Model
    from mesh._models.scripted import Script

__all__ = ["DEFAULT_MODEL", "Agent"]

DEFAULT_MODEL = "gemini-2.5-flash"
_NAME = re.compile(r"^[a-z][a-z0-9-]{0,62}$")


@dataclass(frozen=True)
class Agent:
    name: str
    description: str = ""
    # The system instruction. Never published in the agent card.
    instruction: str | None = None
    # A model name (resolved at run time: Gemini with a key, else the scripted model), a Model,
    # or None for an agent without a model (only function skills).
    model: str | Model | None = None
    # Functions, Tool objects or Toolsets (e.g. ``remote("credit-bureau")``).
    tools: Sequence[Any] = ()
    skills: Sequence[Skill] = ()
    # The offline script the ScriptedModel follows when no model key is configured.
    script: Script | None = None
    version: str = "0.1.0"
    tags: Sequence[str] = ()
    max_model_calls: int = 10
    temperature: float | None = None
    # Free-form, shown in /introspect.
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ConfigError(
                f"agent name {self.name!r} is invalid: use lowercase letters, digits and '-', "
                "starting with a letter (it becomes a DNS-friendly service name)"
            )
        if self.max_model_calls < 1:
            raise ConfigError(f"agent {self.name!r}: max_model_calls must be >= 1")
        ids = [s.id for s in self.skills]
        dupes = {i for i in ids if ids.count(i) > 1}
        if dupes:
            raise ConfigError(f"agent {self.name!r}: duplicate skill ids {sorted(dupes)}")
        if self.is_llm and TEXT_SKILL_ID in ids:
            raise ConfigError(
                f"agent {self.name!r}: skill id {TEXT_SKILL_ID!r} is reserved for the free-text skill"
            )
        if not self.is_llm and not self.skills:
            raise ConfigError(
                f"agent {self.name!r} has neither a model/instruction nor skills: give it an "
                "instruction (an LLM agent) or at least one @skill function"
            )
        if not self.is_llm and any(s.llm for s in self.skills):
            raise ConfigError(
                f"agent {self.name!r}: LLM-handled skills need a model or an instruction"
            )

    @property
    def is_llm(self) -> bool:
        """An LLM agent has a model or an instruction (and so a runner and a text skill)."""
        return self.model is not None or self.instruction is not None

    @property
    def model_name(self) -> str | None:
        if self.model is None:
            return DEFAULT_MODEL if self.instruction is not None else None
        return self.model if isinstance(self.model, str) else self.model.name

    def skill(self, skill_id: str) -> Skill | None:
        return next((s for s in self.skills if s.id == skill_id), None)

    @property
    def all_skills(self) -> list[Skill]:
        """Declared skills plus the free-text skill of an LLM agent."""
        skills = list(self.skills)
        if self.is_llm:
            skills.append(
                Skill(
                    id=TEXT_SKILL_ID,
                    name="Chat",
                    description=self.description or f"Talk to {self.name} in free text.",
                    tags=("text",),
                )
            )
        return skills
