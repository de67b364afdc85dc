"""The agent tests/test_node_ask_adk.py serves: tests.ask_agents' ``review`` as the ONE typed
skill of its agent, so a text-only client's JSON object (Google ADK names no skill) selects
it without naming it."""

from __future__ import annotations

from mesh import Agent
from tests.ask_agents import review

approver = Agent(name="approver", description="Asks before it approves.", skills=[review])
