"""Polling for a condition another process brings about (a worker, a server, a replica)."""

from __future__ import annotations

import time


def wait_until(predicate, timeout: float, what: str):
    """Call ``predicate`` every 0.2 s until it returns something truthy; returns that value.

    Raises AssertionError naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
