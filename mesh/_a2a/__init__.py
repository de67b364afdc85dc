"""The A2A side of a node: card, JSON-RPC handler, executor, task store, client.

Importing this package turns off the a2a-sdk's OpenTelemetry instrumentation unless the
operator set ``OTEL_INSTRUMENTATION_A2A_SDK_ENABLED`` themselves. The SDK wraps every handler
call in ``trace_function`` even when no tracer is configured, and that no-op tracing cost ~12 %
of a node's CPU per task (docs/performance.md). The SDK reads the variable once, at import, so
this must run before anything imports ``a2a``; mesh's own trace context (``traceparent`` in the
task metadata, see mesh._tracing) does not depend on it. ``OTEL_INSTRUMENTATION_A2A_SDK_ENABLED=true``
turns the SDK's spans back on.
"""

from __future__ import annotations

import os

os.environ.setdefault("OTEL_INSTRUMENTATION_A2A_SDK_ENABLED", "false")
