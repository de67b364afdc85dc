"""A2A task states, grouped the way mesh decides on them.

Defined here rather than imported: the SDK keeps its own sets in a module it does not export
(``a2a.server.agent_execution.active_task``), and the groups are the protocol's (A2A 1.0,
"TaskState"): a terminal task never changes again, an interrupted one waits for its caller.
"""

from __future__ import annotations

from a2a.types import TaskState

__all__ = ["COMPLETED", "INTERRUPTED_STATES", "SETTLED_STATES", "TERMINAL_STATES", "WORKING"]

#: The task is over: nothing changes it any more.
TERMINAL_STATES = frozenset(
    {
        TaskState.TASK_STATE_COMPLETED,
        TaskState.TASK_STATE_CANCELED,
        TaskState.TASK_STATE_FAILED,
        TaskState.TASK_STATE_REJECTED,
    }
)
#: The task waits for its caller (more input, or credentials).
INTERRUPTED_STATES = frozenset(
    {TaskState.TASK_STATE_INPUT_REQUIRED, TaskState.TASK_STATE_AUTH_REQUIRED}
)
#: Where a blocking send answers: terminal or interrupted.
SETTLED_STATES = TERMINAL_STATES | INTERRUPTED_STATES

# The states every task's run names, read once: ``TaskState.X`` is found by the enum wrapper's
# ``__getattr__`` only after the plain lookup failed (an AttributeError made and dropped, ~4,000
# instructions a read on a typed fast-path request).
#: The task runs.
WORKING = TaskState.TASK_STATE_WORKING
#: The task finished its work.
COMPLETED = TaskState.TASK_STATE_COMPLETED
