"""design §3 property test (design §3): random sequences of write/remove/move (of documents and of
whole folders) across transactions.

After every transaction the tree at HEAD equals a model dict (applied in call order, with the
same errors), ``git ls-tree -r`` agrees, ``git fsck --strict`` is clean and ``git status`` is clean.
At the end, ``history(path)`` agrees with ``git log --follow`` for every path whose moves git can
see (exact renames: source deleted, destination new, bytes unchanged) and, for every path, with
``git log -- path`` stitched together at the moves the store recorded.
"""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.commands import git

from kb.errors import DocumentNotFound, PathExists
from kb.paths import blob_id

PATHS = ["/documents/a.md", "/documents/b.md", "/documents/f/c.md", "/documents/f/d.md", "/documents/g/h/e.md"]
FOLDERS = ["/documents/f", "/documents/g", "/documents/g/h", "/documents/k"]
_workspaces = itertools.count(100)
_contents = itertools.count()

op = st.one_of(
    st.tuples(st.just("write"), st.sampled_from(PATHS)),
    st.tuples(st.just("remove"), st.sampled_from(PATHS)),
    st.tuples(st.just("move"), st.sampled_from(PATHS), st.sampled_from(PATHS), st.booleans()),
    st.tuples(st.just("remove_folder"), st.sampled_from(FOLDERS)),
    st.tuples(st.just("move_folder"), st.sampled_from(FOLDERS), st.sampled_from(FOLDERS), st.booleans()),
)
transaction = st.tuples(st.lists(op, max_size=5), st.sampled_from([False, False, False, True]))  # (ops, abort)


class Abort(Exception):
    """Raised inside a transaction block to abandon it."""


def apply_model(model: dict, operation) -> type[Exception] | None:
    """Apply one operation to the model; return the error class the store must raise, if any."""
    kind, path, *rest = operation
    if kind == "write":
        model[path] = f"content {next(_contents)}\n".encode()  # unique bytes: git renames are exact
    elif kind == "remove":
        if path not in model:
            return DocumentNotFound
        del model[path]
    elif kind == "remove_folder":
        inside = [p for p in model if p.startswith(path + "/")]
        if not inside:
            return DocumentNotFound
        for p in inside:
            del model[p]
    elif kind == "move_folder":
        dst, overwrite = rest
        inside = sorted(p for p in model if p.startswith(path + "/"))
        if not inside:
            return DocumentNotFound
        if dst == path:
            return None
        if dst.startswith(path + "/"):
            return PathExists
        pairs = [(p, dst + p[len(path) :]) for p in inside]
        if not overwrite and any(p.startswith(dst + "/") for p in model):
            return PathExists  # a folder never merges into an existing one without overwrite (design §3)
        values = {old: model.pop(old) for old, _ in pairs}
        for old, new in pairs:
            model[new] = values[old]
    else:
        dst, overwrite = rest
        if path not in model:
            return DocumentNotFound
        if dst != path:
            if dst in model and not overwrite:
                return PathExists
            model[dst] = model.pop(path)
    return None


def stitched_history(kb, ws, repo, path):
    """History of ``path`` from ``git log`` (no rename detection), jumping at recorded moves."""
    result, current, start = [], path[1:], "HEAD"
    while current:
        revisions = git(repo, "log", "--format=%H", start, "--", current).split()
        following, current = current, None
        for revision in revisions:
            result.append(revision)
            change = {c.path: c for c in kb.list_changes(ws, revision)}["/" + following]
            if change.change == "moved":
                current, start = change.old_path[1:], revision + "^"
                break
    return result


def git_can_follow(kb, ws, repo, history):
    """True when every recorded move in ``history`` is an exact rename git detects."""
    for revision in history:
        change = revision.changes[0]
        if change.change != "moved":
            continue
        parent = revision.parent_id
        before = kb.list_paths(ws, parent)
        after = kb.list_paths(ws, revision.id)
        if change.path in before or change.old_path in after or before.get(change.old_path) != after[change.path]:
            return False
    return True


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(transaction, min_size=1, max_size=6))
def test_random_transactions_match_model_and_git(kb, transactions):
    ws = next(_workspaces)
    kb.create_workspace(ws)
    repo = kb.settings.knowledge_store / str(ws)
    model: dict[str, bytes] = {}
    for operations, abort in transactions:
        trial = dict(model)
        head_before = kb.head(ws)
        try:
            with kb.transaction(ws, None, "prop") as tx:
                for operation in operations:
                    expected_error = apply_model(trial, operation)
                    kind, path, *rest = operation
                    args = (path, trial.get(path, b"")) if kind == "write" else (path, *rest[:1])
                    kwargs = {"overwrite": rest[1]} if kind.startswith("move") else {}
                    kind = kind.removesuffix("_folder")
                    if expected_error is None:
                        getattr(tx, kind)(*args, **kwargs)
                    else:
                        try:
                            getattr(tx, kind)(*args, **kwargs)
                        except expected_error:
                            pass
                        else:
                            raise AssertionError(f"{operation} should raise {expected_error.__name__}")
                    for p in {*PATHS, *trial}:  # the draft sees its own calls
                        assert tx.exists(p) == (p in trial)
                if abort:
                    raise Abort
        except Abort:
            assert kb.head(ws) == head_before
            continue
        if trial == model:
            assert tx.revision is None and kb.head(ws) == head_before
        else:
            assert tx.revision is not None and kb.head(ws) == tx.revision.id
        model = trial
        assert kb.list_paths(ws) == {p: blob_id(data) for p, data in model.items()}
        assert {p: kb.read(ws, p) for p in model} == model
        if kb.head(ws):
            listed = git(repo, "ls-tree", "-r", "HEAD").splitlines()
            assert {"/" + line.split("\t")[1]: line.split()[2] for line in listed} == kb.list_paths(ws)
            assert all(line.startswith("100644 blob ") for line in listed)
            git(repo, "fsck", "--strict")
            # the index kb maintains describes HEAD's tree exactly
            assert git(repo, "write-tree") == git(repo, "rev-parse", "HEAD^{tree}")
        assert git(repo, "status", "--porcelain", "--untracked-files=all") == ""
    for path in sorted(model)[:3]:
        history = kb.history(ws, path, limit=1000)
        ids = [r.id for r in history]
        assert ids == stitched_history(kb, ws, repo, path)
        if git_can_follow(kb, ws, repo, history):
            assert ids == git(repo, "log", "--follow", "--format=%H", "--", path[1:]).split(), path
