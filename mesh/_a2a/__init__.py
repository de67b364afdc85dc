"""The A2A side of a node: card, JSON-RPC handler, executor, task store, client.

Importing it changes nothing in the process: a2a-sdk's OpenTelemetry spans are turned off by
``mesh serve`` (its entry point sets ``OTEL_INSTRUMENTATION_A2A_SDK_ENABLED=false`` unless the
operator set it, before ``a2a`` is imported; see ``mesh._cli.serve._quiet_sdk_tracing``). An app
that embeds a node in its own process decides for itself (docs/node.md).
"""

from __future__ import annotations
