"""The turns a KnowledgeBase holds open (design §5): one ``Turn`` object per root turn id and
workspace, so sub-agent ids (``root::task:7``) share their root's.

A committed or closed turn leaves the set of *open* turns (whose worktree flocks ``close_all``
releases) but stays the one object handed out for its id while any caller still holds it: a
sub-agent's old handle and a new ``kb.turn()`` call are the same Turn, so one process never holds
a turn id twice (which made its own sub-agents see TurnBusy), and a handle reused after commit
registers itself as open again.

A turn becomes open when it opens its worktree: at its first operation, or its first after a
commit, abort or idle release. An ``admission`` (``KnowledgeBase.admit_turns``) may refuse that,
under the lock that makes it open, so that a bound on open turns (``kb serve``'s per token, design
§16) holds however many threads race: checked only when a turn was looked up, a turn reused after
another thread committed it became open again past the count. A commit or abort is never
refused."""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kb.store.knowledge_store import KnowledgeStore
    from kb.turns.turn import Turn


Admission = Callable[[tuple[int, str], list[tuple[int, str]]], None]
"""``admit(key, open_keys)``: raises (a KbError) to refuse that the turn of ``key`` (workspace id,
root turn id) become open while ``open_keys`` are; returns to let it."""


class OpenTurns:
    """``{(workspace id, root turn id): Turn}`` of the turns of one KnowledgeBase: the open ones
    held strongly, every one handed out held weakly (alive while some caller holds it)."""

    def __init__(self) -> None:
        self.admission: Admission | None = None
        self._open: dict[tuple[int, str], Turn] = {}
        self._handed_out: weakref.WeakValueDictionary[tuple[int, str], Turn] = weakref.WeakValueDictionary()
        self._lock = threading.Lock()
        self._asked: dict[tuple[int, str], float] = {}  # key -> time.monotonic() of its last turn() call

    def turn(self, store: KnowledgeStore, turn_id: str, author: str, committer: str | None) -> Turn:
        """The Turn of ``turn_id``'s root in ``store``'s workspace: the open one, else the one a
        caller still holds (a turn reused after commit), else a new one (nothing touches the disk
        until its first file operation, where it becomes open, ``_hold``). Raises InvalidTurn."""
        from kb.git.worktree import root_turn_id  # imported by the first turn: one-shot commands open none
        from kb.turns.turn import Turn

        key = (store.workspace_id, root_turn_id(turn_id))
        with self._lock:
            turn = self._open.get(key) or self._handed_out.get(key)
            if turn is None:
                turn = Turn(
                    store,
                    turn_id,
                    author,
                    committer=committer,
                    on_close=lambda t: self._forget(key, t),
                    on_open=lambda t, ending: self._hold(key, t, ending),
                )
                self._handed_out[key] = turn  # open (``_hold``) at its first operation
            self._asked[key] = time.monotonic()
        return turn

    def open_keys(self) -> list[tuple[int, str]]:
        """``(workspace id, root turn id)`` of every open turn."""
        with self._lock:
            return list(self._open)

    def close_idle(self, idle_seconds: float) -> int:
        """Close the open turns no ``turn()`` call asked for in the last ``idle_seconds``: their
        worktree flocks are released and their worktrees stay, so a later call of the same turn id
        takes the worktree up again (and commits it), and the janitor removes one left idle past
        ``KB_WORKTREE_TTL`` (design §5). A turn busy in a call is closed once that call ends.
        Returns how many were closed."""
        cutoff = time.monotonic() - idle_seconds
        with self._lock:
            idle = [(key, turn) for key, turn in self._open.items() if self._asked.get(key, 0.0) < cutoff]
            for key in [k for k in self._asked if k not in self._open and k not in self._handed_out]:
                del self._asked[key]  # forgotten turns: no entry outlives its turn
        closed = 0
        for key, turn in idle:
            with self._lock:
                if self._asked.get(key, 0.0) >= cutoff:
                    continue  # asked for meanwhile
            turn.close()
            closed += 1
        return closed

    def _forget(self, key: tuple[int, str], turn: Turn) -> None:
        with self._lock:
            if self._open.get(key) is turn:
                del self._open[key]

    def _hold(self, key: tuple[int, str], turn: Turn, ending: bool) -> None:
        """``turn`` is about to open its worktree: it is the open turn of ``key`` (again), if the
        admission lets it — asked when it is not open yet and not ``ending`` (a commit or abort)."""
        with self._lock:
            if self._open.get(key) is not turn and not ending and self.admission is not None:
                self.admission(key, [k for k in self._open if k != key])
            self._open[key] = turn
            self._handed_out[key] = turn

    def close_all(self) -> None:
        """Close every open turn (their worktrees stay for a later commit or the janitor)."""
        with self._lock:
            turns = list(self._open.values())
        for turn in turns:
            turn.close()

    def forget_workspace(self, workspace_id: int) -> None:
        """Drop the turns of a deleted workspace without closing them (their worktrees are gone)."""
        with self._lock:
            for key in [k for k in self._open if k[0] == workspace_id]:
                del self._open[key]
            for key in [k for k in list(self._handed_out.keys()) if k[0] == workspace_id]:
                self._handed_out.pop(key, None)
