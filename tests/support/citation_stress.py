"""Searches checked against git while commits, projections and index runs race (design §7, §8),
shared by the CI test (a few seconds) and ``bin/stress_citations.py`` (minutes).

Threads on one KnowledgeBase (or one each, ``shared=False``): a writer commits random edits,
additions, removals, moves, moves with edits and swaps; an index run, a reindex and a projection
loop; searchers search. Every search is checked as a reader would check it:

- every error is a KbError (never psycopg's, dulwich's or the OS's);
- cites are 1..n and no path is shown twice;
- every envelope's ``(path, revision)`` exists — ``git show REVISION:PATH`` with the real git
  CLI — and each numbered line is that file's line.

Afterwards one more index run must converge: projected revision = index stamp = HEAD, every
document indexed, nothing failed. Faults found this way (an envelope citing a path its revision
does not have, lines of another blob, a crash on a document with chunks and no indexed blob, the
same path twice) are the regression tests in tests/test_index_citations.py.
"""

from __future__ import annotations

import random
import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

from kb.errors import KbError
from kb.knowledge_base import KnowledgeBase

VOCABULARY = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "kappa",
    "omega",
    "sigma",
    "refund",
    "policy",
    "annual",
    "plan",
    "invoice",
    "tomato",
    "river",
]
QUERIES = ["alpha gamma", "refund policy", "annual plan invoice", "tomato", "river omega", "## Heading"]
FIRST_DOCUMENTS = 30


@dataclass
class StressReport:
    """Counts of what ran (``counts``) and the faults found (``faults``: up to 20 one-line
    descriptions, ``fault_counts`` by kind)."""

    counts: Counter = field(default_factory=Counter)
    fault_counts: Counter = field(default_factory=Counter)
    faults: list[str] = field(default_factory=list)

    def fault(self, kind: str, detail: str) -> None:
        self.fault_counts[kind] += 1
        if len(self.faults) < 20:
            self.faults.append(f"{kind}: {detail[:300]}")


def _body(rng: random.Random, tag: str) -> str:
    lines = []
    for i in range(rng.randint(1, 40)):
        roll = rng.random()
        if roll < 0.1:
            lines.append(f"## Heading {rng.choice(VOCABULARY)} {i}")
        elif roll < 0.2:
            lines.append("")
        else:
            lines.append(" ".join(rng.choice(VOCABULARY) for _ in range(rng.randint(1, 20))) + f" {tag}x{i}")
    newline = "\r\n" if rng.random() < 0.2 else "\n"
    return newline.join(lines) + (newline if rng.random() < 0.7 else "")


def git_lines(repo: str, revision: str, path: str, cache: dict) -> list[str] | None:
    """The lines of ``git show REVISION:PATH`` (the real git CLI) in ``repo``, None when the path is
    not in that revision; kept in ``cache`` by (revision, path)."""
    key = (revision, path)
    if key not in cache:
        shown = subprocess.run(["git", "-C", repo, "show", f"{revision}:{path.lstrip('/')}"], capture_output=True)
        cache[key] = None if shown.returncode else shown.stdout.decode("utf-8").replace("\r\n", "\n").split("\n")
    return cache[key]


def stress(
    kb: KnowledgeBase, workspace_id: int, seconds: float, seed: int = 0, shared: bool = True, searchers: int = 2
) -> StressReport:
    """Run the race for ``seconds`` on a new workspace ``workspace_id`` of ``kb`` (hashing or any
    embedder already set on it); returns the StressReport (see the module docstring)."""
    report = StressReport()
    rng = random.Random(seed)
    kb.create_workspace(workspace_id)
    repo = str(kb.settings.knowledge_store / str(workspace_id))
    paths = [f"/documents/d{i}.md" for i in range(FIRST_DOCUMENTS)]
    with kb.transaction(workspace_id, "first documents", "stress") as tx:
        for i, path in enumerate(paths):
            tx.write(path, _body(rng, f"d{i}"))
    kb.index(workspace_id)
    stop = threading.Event()
    lock = threading.Lock()

    def guarded(kind: str, step) -> None:
        try:
            step()
            report.counts[kind] += 1
        except KbError:
            report.counts[f"{kind} refused"] += 1  # a KbError is an answer (e.g. a path gone meanwhile)
        except Exception as exc:  # any other error escaping the facade is a fault
            report.fault(f"{kind} raised {type(exc).__module__}.{type(exc).__name__}", str(exc))

    def writer() -> None:
        local = random.Random(seed + 1)
        n = 0
        while not stop.is_set():
            n += 1
            with lock:
                known = list(paths)

            def change() -> None:
                with kb.transaction(workspace_id, f"change {n}", "stress") as tx:
                    roll = local.random()
                    a, b = local.sample(known, 2)
                    if roll < 0.35:
                        tx.write(a, _body(local, f"e{n}"))
                    elif roll < 0.5:
                        tx.write(f"/documents/n{n}.md", _body(local, f"n{n}"))
                        known.append(f"/documents/n{n}.md")
                    elif roll < 0.6 and len(known) > 10:
                        tx.remove(a)
                        known.remove(a)
                    elif roll < 0.75:
                        tx.move(a, f"/documents/m{n}.md")
                        known[known.index(a)] = f"/documents/m{n}.md"
                    elif roll < 0.9:
                        tx.move(a, f"/documents/m{n}.md")
                        tx.write(f"/documents/m{n}.md", _body(local, f"m{n}"))
                        known[known.index(a)] = f"/documents/m{n}.md"
                    else:  # swap two pages and edit one
                        tx.move(a, "/documents/swap.md")
                        tx.move(b, a)
                        tx.move("/documents/swap.md", b)
                        tx.write(b, _body(local, f"s{n}"))

            guarded("commit", change)
            with lock:
                paths[:] = known

    def loop(kind: str, step) -> None:
        while not stop.is_set():
            guarded(kind, step)

    def searcher(number: int) -> None:
        own = kb if shared else KnowledgeBase.open(kb.settings)
        local, cache = random.Random(seed + 10 + number), {}
        try:
            while not stop.is_set():
                try:
                    found = own.search(workspace_id, local.choice(QUERIES), k=local.choice([1, 5, 10]))
                except KbError:
                    report.counts["search refused"] += 1
                    continue
                except Exception as exc:
                    report.fault(f"search raised {type(exc).__module__}.{type(exc).__name__}", str(exc))
                    continue
                report.counts["search"] += 1
                if [e.cite for e in found] != list(range(1, len(found) + 1)):
                    report.fault("cites not 1..n", str([e.cite for e in found]))
                if len({e.path for e in found}) != len(found):
                    report.fault("a path shown twice", str([e.path for e in found]))
                for envelope in found:
                    lines = git_lines(repo, envelope.revision, envelope.path, cache)
                    if lines is None:
                        report.fault("path not at its revision", f"{envelope.path} @ {envelope.revision}")
                        continue
                    for number_, text in envelope.lines:
                        if number_ is not None and (number_ > len(lines) or lines[number_ - 1] != text):
                            report.fault("line not git's", f"{envelope.path} @ {envelope.revision} line {number_}")
                            break
                    report.counts["envelope"] += 1
        finally:
            if own is not kb:
                own.close()

    threads = [
        threading.Thread(target=writer),
        threading.Thread(target=loop, args=("index", lambda: kb.index(workspace_id))),
        threading.Thread(target=loop, args=("reindex", lambda: kb.reindex(workspace_id))),
        threading.Thread(target=loop, args=("project", lambda: kb.project(workspace_id))),
    ]
    threads += [threading.Thread(target=searcher, args=(i,)) for i in range(searchers)]
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join(120)
        if thread.is_alive():
            report.fault("a thread did not stop", thread.name)

    final = kb.index(workspace_id)
    workspace = next(w for w in kb.workspaces() if w["id"] == workspace_id)
    head = kb.head(workspace_id)
    if not workspace["last_projected_revision"] == workspace["last_indexed_revision"] == head:
        report.fault(
            "not converged",
            f"head {head}, stamp {workspace['last_indexed_revision']}, "
            f"projected {workspace['last_projected_revision']}",
        )
    if final.failures:
        report.fault("documents failed", str(final.failures))
    counts = kb.status(workspace_id)["workspace"]
    if counts["failed"] or counts["quarantined"] or counts["pending"]:
        report.fault(
            "documents not indexed",
            f"{counts['failed']} failed, {counts['quarantined']} quarantined, {counts['pending']} pending",
        )
    report.counts["documents at the end"] = counts["documents"]
    return report
