"""One live Turn per root turn id per KnowledgeBase (design §5): sub-agents sharing a root's turn
never see TurnBusy from their own process, even across the turn's commits, and ``kb.close()``
releases every worktree flock it holds."""

from __future__ import annotations

import threading

import pytest

from kb.errors import TooManyTurns, TurnBusy
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


def _at_most(most: int):
    """An admission (``KnowledgeBase.admit_turns``) bounding the open turns at ``most``, and the
    keys it was asked about."""
    asked = []

    def admit(key, open_keys):
        asked.append(key)
        if len(open_keys) >= most:
            raise TooManyTurns(f"{len(open_keys)} open")

    return admit, asked


def test_a_turn_reused_after_its_commit_is_counted_again_when_it_reopens(kb):
    # the race the bound missed: a request looked turn x up while it was open (no count needed),
    # another request committed x and a third opened y in x's place; the first request's write
    # then reopened x past the bound. The bound is checked where a turn becomes open.
    kb.create_workspace(WS)
    admit, asked = _at_most(1)
    kb.admit_turns(admit)
    x = kb.turn(WS, "x")
    x.write("/documents/x.md", "x\n")
    assert kb.open_turns() == [(WS, "x")]
    x.commit("x")
    y = kb.turn(WS, "y")
    y.write("/documents/y.md", "y\n")  # admitted: x is not open any more
    with pytest.raises(TooManyTurns):
        x.write("/documents/x2.md", "x2\n")  # the handle held from before reopens: refused
    assert kb.open_turns() == [(WS, "y")]
    assert y.commit("y") is not None  # a commit is never refused
    x.write("/documents/x2.md", "x2\n")  # y is committed: x may open again
    assert sorted(x.commit("x2").added) == ["/documents/x2.md"]
    assert asked.count((WS, "x")) == 3 and asked.count((WS, "y")) == 1


def test_a_commit_or_abort_is_never_refused_by_the_bound(kb):
    kb.create_workspace(WS)
    admit, _ = _at_most(1)
    kb.admit_turns(admit)
    x = kb.turn(WS, "x")
    x.write("/documents/x.md", "x\n")
    x.close()  # released idle: its worktree stays to be committed
    kb.turn(WS, "y").write("/documents/y.md", "y\n")  # the one open turn the bound allows
    with pytest.raises(TooManyTurns):
        kb.turn(WS, "z").write("/documents/z.md", "z\n")
    assert sorted(x.commit("x").added) == ["/documents/x.md"]  # reopened to commit: not refused
    z = kb.turn(WS, "z")
    with pytest.raises(TooManyTurns):
        z.write("/documents/z.md", "z\n")
    z.abort()  # nothing to abort, and never refused
    kb.turn(WS, "y").abort()
    kb.turn(WS, "z").write("/documents/z.md", "z\n")
    assert kb.open_turns() == [(WS, "z")]


def test_a_turn_that_could_not_open_its_worktree_is_not_counted_open(kb, settings):
    kb.create_workspace(WS)
    other = KnowledgeBase.open(settings)
    try:
        other.turn(WS, "x").write("/documents/x.md", "x\n")  # another process's holder of x
        with pytest.raises(TurnBusy):
            kb.turn(WS, "x").write("/documents/x.md", "mine\n")
        assert kb.open_turns() == []  # it counts against no bound
    finally:
        other.close()


def test_two_first_writes_name_one_author_and_other_turns_are_not_held_up(kb):
    """``Turn.acting_for`` names a turn's author under that turn's own lock: of two first writes
    racing with different authors exactly one names it and the other is AuthorConflict; while one
    turn's writing request holds its lock, another turn of the same KnowledgeBase reads, writes and
    commits (the naming serializes one turn, never the server's turns, design §5, §16)."""
    from kb.errors import AuthorConflict

    kb.create_workspace(WS)
    shared = kb.turn(WS, "shared", "Made <made@example.com>")
    outcomes: dict[str, str] = {}
    start = threading.Barrier(2)

    def first_write(author: str) -> None:
        start.wait()
        try:
            with shared.acting_for(author) as turn:
                turn.write(f"/documents/{author.split()[0]}.md", "x\n")
            outcomes[author] = "named"
        except AuthorConflict:
            outcomes[author] = "refused"

    threads = [threading.Thread(target=first_write, args=(a,)) for a in ("Ada <a@x>", "Bob <b@x>")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes.values()) == ["named", "refused"], outcomes
    named = next(a for a, outcome in outcomes.items() if outcome == "named")
    assert shared.author == named
    # one turn's writing request in progress holds up no other turn
    inside, release = threading.Event(), threading.Event()

    def held_open() -> None:
        with shared.acting_for(None):
            inside.set()
            release.wait()

    holder = threading.Thread(target=held_open)
    holder.start()
    try:
        assert inside.wait(60)
        other = kb.turn(WS, "other")
        with other.acting_for("Cy <c@x>") as turn:
            turn.write("/documents/Other.md", "o\n")
        assert other.read("/documents/Other.md").lines == [(1, "o")]
        assert other.commit("other").added == ["/documents/Other.md"]
    finally:
        release.set()
        holder.join()
    assert shared.commit("shared") is not None
    assert shared.author == "Made <made@example.com>"  # recorded: the next write names it again
