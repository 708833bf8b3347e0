"""Loopback ports for the servers a test starts (kb serve, git daemon, PgBouncer, zero-cache, …)."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on right now (the OS picks it; another process
    may still take it before the caller binds, which a loopback test accepts)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
