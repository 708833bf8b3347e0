"""What kb announced on the ``kb_events`` channel (design §6), as a test's listener received it."""

from __future__ import annotations

import json

import psycopg


def received_events(listener: psycopg.Connection) -> list[dict]:
    """The payloads ``listener`` (a connection that ran ``LISTEN kb_events``) received within
    half a second, decoded."""
    return [json.loads(n.payload) for n in listener.notifies(timeout=0.5)]
