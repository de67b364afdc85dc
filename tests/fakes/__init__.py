"""Local stand-ins for external services, served on 127.0.0.1 and driven by the real SDKs."""
