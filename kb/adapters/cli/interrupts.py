"""Ctrl-C during a CLI write (design §3): the command says what became of its revision.

A writing command gives its write an idempotency key and runs it through :func:`settled`; a
``KeyboardInterrupt`` then asks ``write_outcome`` with that key (a second Ctrl-C is ignored while
it asks, a few seconds at most) and says exactly one of: the revision had already landed (its
id), nothing was recorded, or — Postgres cannot be asked — that it is unknown, with the
``kb write-outcome`` command that settles it. Every such end exits 130, as a shell expects of an
interrupted command. (``kb import`` settles the same way, and also removes the empty workspace
an interrupted first import made.)
"""

from __future__ import annotations

import signal
import uuid
from collections.abc import Callable
from typing import NoReturn, TypeVar

import click

from kb.errors import KbError, WorkspaceNotFound

T = TypeVar("T")

NOT_BEGUN, WRITING, RECORDED = "not begun", "writing", "recorded"
"""Where this process's keyed write stands (:func:`write_state`)."""
_state = [NOT_BEGUN]


def write_state() -> str:
    """Where the command's keyed write stands: NOT_BEGUN (no revision can have been recorded),
    WRITING (Ctrl-C now is settled by key, :func:`settle`) or RECORDED (it returned: it landed
    or had nothing to record). The CLI's generic Ctrl-C handler says what it can from this."""
    return _state[0]


def mark(state: str) -> None:
    """Set :func:`write_state` (``kb import`` settles by hand, so it marks by hand)."""
    _state[0] = state


def settled(kb, workspace: int, command: str, write: Callable[[str], T]) -> T:
    """Run ``write(key)`` — a write recording at most one revision of ``workspace`` with the
    idempotency key it is given — and return what it returns. On Ctrl-C, settle it by that key
    (:func:`settle`) and exit 130 saying what became of it (``command``, e.g. ``"kb mv"``, names it)."""
    key = uuid.uuid4().hex
    mark(WRITING)
    try:
        result = write(key)
    except KeyboardInterrupt:
        settle(kb, workspace, key, f"`{command}`")
    mark(RECORDED)
    return result


def settle(kb, workspace: int, key: str, what: str, recorded_nothing: Callable[[], None] | None = None) -> NoReturn:
    """After a Ctrl-C, ask ``write_outcome`` for ``key`` (further Ctrl-C ignored meanwhile) and
    exit 130 saying what became of the write (``what``: ``"the import"``, ``"`kb mv`"``): landed
    (its revision), nothing recorded (``recorded_nothing`` runs first, e.g. to remove the empty
    workspace a first import made), or unknown with the ``kb write-outcome`` that settles it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        revision = kb.write_outcome(workspace, key)
    except WorkspaceNotFound:
        revision = None
    except KbError as exc:
        click.echo(
            f"kb: interrupted; whether {what} was recorded is unknown ({exc}). Run "
            f"`kb write-outcome {key} --workspace {workspace}` to find out before trying again.",
            err=True,
        )
        raise SystemExit(130) from None
    if revision is not None:
        click.echo(f"kb: interrupted, but {what} had already landed: revision {revision.id}", err=True)
        raise SystemExit(130) from None
    if recorded_nothing is not None:
        recorded_nothing()
    click.echo(f"kb: interrupted: {what} did not land: nothing was recorded in workspace {workspace}", err=True)
    raise SystemExit(130) from None
