"""One live Turn per root turn id per KnowledgeBase (design §5): sub-agents sharing a root's turn
never see TurnBusy from their own process, even across the turn's commits, and ``kb.close()``
releases every worktree flock it holds."""

from __future__ import annotations

import threading

from kb.errors import TurnBusy
from kb.knowledge_base import KnowledgeBase

WS = 1


def test_a_turn_reused_after_commit_is_the_one_handed_out_again(kb):
    kb.create_workspace(WS)
    a = kb.turn(WS, "root::task:A")
    b = kb.turn(WS, "root::task:B")
    assert a is b  # sub-agents share the root's turn
    a.write("/documents/x.md", "x\n")
    assert a.commit("A") is not None
    c = kb.turn(WS, "root::task:C")
    assert c is a  # still held by a and b: the same object, not a second Turn on the same id
    b.write("/documents/y.md", "y\n")  # the old handle reopens the worktree
    kb.turn(WS, "root::task:D").write("/documents/z.md", "z\n")  # no TurnBusy from our own process
    kb.close()  # releases the flock the reopened worktree holds
    kb.turn(WS, "root").write("/documents/w.md", "w\n")
    result = kb.turn(WS, "root").commit("rest")
    assert sorted(result.added) == ["/documents/w.md", "/documents/y.md", "/documents/z.md"]


def test_kb_close_releases_the_flock_of_a_turn_reopened_after_commit(kb):
    kb.create_workspace(WS)
    held = kb.turn(WS, "r::task:1")
    held.write("/documents/a.md", "a\n")
    held.commit()
    kb.turn(WS, "r::task:2")  # asked for while the committed turn is out of the registry
    held.write("/documents/b.md", "b\n")  # reopened: registered again
    kb.close()
    other = KnowledgeBase.open(kb.settings)  # another holder of the turn id: it must not be busy
    try:
        other.turn(WS, "r").write("/documents/c.md", "c\n")  # the flock was released
        other.turn(WS, "r").abort()
    finally:
        other.close()


def test_sub_agent_threads_committing_never_see_turn_busy(kb):
    kb.create_workspace(WS)
    busy, errors, commits = [], [], []

    def agent(k: int) -> None:
        for i in range(12):
            turn = kb.turn(WS, f"shared::task:{k}")
            try:
                turn.write(f"/documents/t{k}-{i}.md", f"{k} {i}\n")
                if i % 4 == 3:
                    result = turn.commit(f"agent {k} step {i}")
                    if result is not None:
                        commits.append(result.revision)
            except TurnBusy as exc:
                busy.append(exc)
            except Exception as exc:
                errors.append(exc)

    threads = [threading.Thread(target=agent, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not busy and not errors
    kb.turn(WS, "shared").commit("rest")
    assert commits
