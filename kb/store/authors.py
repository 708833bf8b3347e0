"""Who a revision records when the caller names nobody (design §3)."""

from __future__ import annotations

import getpass

from kb.git.repository import format_identity


def default_author() -> str:
    """The OS user name, used when a caller names no author; ``kb`` when there is none."""
    try:
        return getpass.getuser()
    except Exception:
        return "kb"


def git_identity(who: str) -> str:
    """``who`` as a commit holds it (``kb.git.repository.format_identity``: ``Name <email>`` in the
    form ``git fsck --strict`` accepts), and as Postgres records it: ``Name`` alone when there is no
    email. ``A <a> <b>`` is ``A a <b>``, ``<a@x>`` is ``a <a@x>`` (design §3)."""
    return format_identity(who).decode().removesuffix(" <>")
