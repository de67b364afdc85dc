"""``CallPolicy``: which callers may call which skills (``MESH_ALLOW``), checked by the gate.

    MESH_ALLOW="loan-officer -> credit-bureau:score; loan-officer -> income-verifier:*;
                @token -> loan-officer:*"

A rule is ``CALLER -> AGENT:SKILL`` (``AGENT`` alone is ``AGENT:*``); rules are separated by
``;``, ``,`` or new lines. ``CALLER`` is an agent's name (the agent its verified call token
names, ``mesh._identity``), ``*`` (any agent with a verified call token) or ``@token`` (a call
with no caller identity: the shared ``MESH_TOKEN``, as the CLI and the console present it, or
any call to a node that needs no credential). ``AGENT`` is an agent's name or ``*``; ``SKILL`` a
skill id or ``*``.

Unset, every call the gate lets in is allowed (the laptop's simple mode). Set, it is an
allow-list: a call is allowed when a rule matches its caller, the called agent and the skill,
and refused otherwise (403 naming the caller, the skill and the rules there are for this
agent). One ``MESH_ALLOW`` can serve the whole mesh (``mesh.toml``'s ``[env]``): each node keeps
the rules for its own agent. The skill of a call is the one its message names (metadata
``skill``); a message naming none needs the agent's only skill, or a rule allowing all of the
agent's skills (the node would pick one from the parts, after the gate). Requests about tasks
(get, cancel, subscribe, list, push configs) need a rule allowing the caller some skill of the
agent. ``parse`` raises ``ConfigError`` naming the first malformed rule: at start, never per
call.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from mesh._errors import ConfigError

__all__ = ["ANY", "UNIDENTIFIED", "CallPolicy", "Rule"]

#: Matches any agent (as the caller: any agent with a verified call token) or any skill.
ANY = "*"
#: The caller of a call without a caller identity (the mesh token, or no credential at all).
UNIDENTIFIED = "@token"
# Agent names and skill ids as mesh._agent and mesh._skills accept them.
_AGENT = re.compile(r"^[a-z][a-z0-9-]{0,62}$")
_SKILL = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_SEPARATORS = re.compile(r"[;,\n]")
_SYNTAX = "CALLER -> AGENT:SKILL, e.g. 'loan-officer -> credit-bureau:score'"
# Rules quoted in a refusal (the rest are counted): a 403 stays a short line.
_QUOTED = 5


@dataclass(frozen=True)
class Rule:
    """One allow rule: ``caller`` may call ``skill`` of ``agent``."""

    caller: str
    agent: str
    skill: str

    def __str__(self) -> str:
        return f"{self.caller} -> {self.agent}:{self.skill}"

    def admits(self, caller: str, skill: str | None) -> bool:
        """Whether this rule (one for the called agent) lets ``caller`` call ``skill``; None:
        some skill of the agent."""
        if self.caller != caller and not (self.caller == ANY and caller != UNIDENTIFIED):
            return False
        return skill is None or self.skill in (ANY, skill)


@dataclass(frozen=True)
class CallPolicy:
    """The allow rules of a mesh (``parse``) or of one agent (``for_agent``)."""

    rules: tuple[Rule, ...]

    @classmethod
    def parse(cls, text: str) -> CallPolicy:
        """The rules of ``text`` (see the module docstring); ``ConfigError`` names the first
        malformed one and says how to write it. An empty text is a policy refusing all."""
        rules = []
        for entry in filter(None, (e.strip() for e in _SEPARATORS.split(text))):
            rules.append(_rule(entry))
        return cls(tuple(rules))

    def for_agent(self, agent: str) -> CallPolicy:
        """The rules that apply to calls to ``agent``."""
        return CallPolicy(tuple(r for r in self.rules if r.agent in (ANY, agent)))

    def check(self, agent: str, skills: Iterable[str]) -> None:
        """``ConfigError`` when a rule for ``agent`` (given its ``skills``) names a skill it does
        not have: a typo would otherwise refuse every call it meant to allow."""
        offered = sorted(skills)
        for rule in self.rules:
            if rule.agent == agent and rule.skill != ANY and rule.skill not in offered:
                raise ConfigError(
                    f"MESH_ALLOW rule {str(rule)!r}: {agent} has no skill {rule.skill!r} "
                    f"(it offers: {', '.join(offered)}); fix the rule or use {agent}:*"
                )

    def allows(self, caller: str, skill: str | None) -> bool:
        """Whether ``caller`` may call ``skill`` (None: some skill) of the agent these rules
        are for (``for_agent``)."""
        return any(rule.admits(caller, skill) for rule in self.rules)

    def allows_all(self, caller: str, skills: Iterable[str]) -> bool:
        """Whether ``caller`` may call every one of ``skills``."""
        return all(self.allows(caller, s) for s in skills)

    def refusal(self, caller: str, agent: str, what: str) -> str:
        """The 403's message: who may not call what, and the rules there are."""
        who = "a caller without a call token (@token)" if caller == UNIDENTIFIED else caller
        quoted = [str(r) for r in self.rules[:_QUOTED]]
        more = len(self.rules) - len(quoted)
        rules = "; ".join(quoted) + (f" and {more} more" if more > 0 else "")
        return (
            f"{who} may not call {what}: no MESH_ALLOW rule allows it "
            + (f"(the rules for {agent}: {rules})" if rules else f"(no rule names {agent})")
            + "; ask the operator to add one"
        )

    def describe(self) -> dict[str, object]:
        """What ``/introspect`` shows: the rules in force and what everything else gets."""
        return {"allow": [str(r) for r in self.rules], "otherwise": "denied (403)"}


def _rule(entry: str) -> Rule:
    caller, arrow, target = entry.partition("->")
    caller, target = caller.strip(), target.strip()
    agent, _, skill = target.partition(":")
    agent, skill = agent.strip(), skill.strip() or ANY
    problem = None
    if not arrow or not caller or not agent:
        problem = "not a rule"
    elif caller not in (ANY, UNIDENTIFIED) and not _AGENT.match(caller):
        problem = f"the caller {caller!r} is not an agent name, '*' or '@token'"
    elif agent != ANY and not _AGENT.match(agent):
        problem = f"the agent {agent!r} is not an agent name or '*'"
    elif skill != ANY and not _SKILL.match(skill):
        problem = f"the skill {skill!r} is not a skill id or '*'"
    if problem is not None:
        raise ConfigError(f"rule {entry!r}: {problem}; write {_SYNTAX}")
    return Rule(caller, agent, skill)
