"""Who a revision records when the caller names nobody (design §3)."""

from __future__ import annotations

import getpass


def default_author() -> str:
    """The OS user name, used when a caller names no author; ``kb`` when there is none."""
    try:
        return getpass.getuser()
    except Exception:
        return "kb"
