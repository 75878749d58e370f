"""Acceptance filters: static check, sandboxed execution checks, timing window, similarity."""
