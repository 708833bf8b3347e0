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


def run_for(threads: list, seconds: float, stop, join_seconds: float) -> None:
    """Start ``threads``, let them run for ``seconds``, set the event ``stop`` and join each (at
    most ``join_seconds`` apiece): how the stress samples run their clients."""
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join(join_seconds)
