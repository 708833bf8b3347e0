"""The turns a KnowledgeBase holds open (design §5): one ``Turn`` object per root turn id and
workspace, so sub-agent ids (``root::task:7``) share their root's, and a closed or committed turn
leaves the registry."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kb.store.knowledge_store import KnowledgeStore
    from kb.turns.turn import Turn


class OpenTurns:
    """``{(workspace id, root turn id): Turn}`` of the turns open in one KnowledgeBase."""

    def __init__(self) -> None:
        self._turns: dict[tuple[int, str], Turn] = {}
        self._lock = threading.Lock()

    def turn(self, store: KnowledgeStore, turn_id: str, author: str, committer: str | None) -> Turn:
        """The open Turn of ``turn_id``'s root in ``store``'s workspace, or a new one (nothing
        touches the disk until its first file operation). Raises InvalidTurn."""
        from kb.git.worktree import root_turn_id  # imported by the first turn: one-shot commands open none
        from kb.turns.turn import Turn

        key = (store.workspace_id, root_turn_id(turn_id))
        with self._lock:
            turn = self._turns.get(key)
            if turn is None:
                turn = Turn(
                    store,
                    turn_id,
                    author,
                    committer=committer,
                    on_close=lambda t: self._forget(key, t),
                    on_open=lambda t: self._hold(key, t),
                )
                self._turns[key] = turn
        return turn

    def _forget(self, key: tuple[int, str], turn: Turn) -> None:
        with self._lock:
            if self._turns.get(key) is turn:
                del self._turns[key]

    def _hold(self, key: tuple[int, str], turn: Turn) -> None:
        with self._lock:
            self._turns.setdefault(key, turn)

    def close_all(self) -> None:
        """Close every open turn (their worktrees stay for a later commit or the janitor)."""
        with self._lock:
            turns = list(self._turns.values())
        for turn in turns:
            turn.close()

    def forget_workspace(self, workspace_id: int) -> None:
        """Drop the turns of a deleted workspace without closing them (their worktrees are gone)."""
        with self._lock:
            for key in [k for k in self._turns if k[0] == workspace_id]:
                del self._turns[key]
