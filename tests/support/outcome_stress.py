"""Writes while Postgres connections are terminated (design §3), shared by the CI sample
(tests/test_outcome_stress.py, a few seconds) and ``bin/stress_outcomes.py`` (N runs, figures).

Writer threads (one KnowledgeBase each) write documents of their own, each write a new path; a
killer terminates (``pg_terminate_backend``) every other backend of the database every 0.1–0.6 s.
Each write's answer is compared with what landed:

- ``misreported``: the answer said nothing was recorded (DatabaseUnavailable, LockUnavailable,
  StorageError, LockTimeout…) but the path is at HEAD, or it named a revision that does not hold it;
- ``unknown``: CommitOutcomeUnknown (honest, and then settled with ``write_outcome`` when the
  store has it);
- ``applied_twice``: a failed write is retried once (with its idempotency key where the store
  takes one); the path then changed in more than one revision.
"""

from __future__ import annotations

import inspect
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import psycopg

from kb.errors import CommitOutcomeUnknown, KbError
from kb.knowledge_base import KnowledgeBase

from .named_queries import queries
from .waiting import run_for  # relative: bin/stress_outcomes.py imports this module as tests.support

TERMINATE = {
    "all": "test_terminate_client_backends",
    # only backends inside a transaction (a write, a lock wait, a settle): a kill while the pool
    # opens a connection sends psycopg_pool into its reconnect backoff (seconds doubling), which
    # stalls every writer of the process without testing anything kb decides
    "busy": "test_terminate_busy_client_backends",
}


@dataclass
class OutcomeReport:
    """What was counted (``counts``) and the misreports found (``faults``, up to 20 lines)."""

    counts: Counter = field(default_factory=Counter)
    faults: list[str] = field(default_factory=list)

    def fault(self, kind: str, text: str) -> None:
        self.counts[kind] += 1
        if len(self.faults) < 20:
            self.faults.append(f"{kind}: {text}")


def _takes_keys(kb: KnowledgeBase) -> bool:
    return "idempotency_key" in inspect.signature(kb.transaction).parameters


def _write(kb: KnowledgeBase, ws: int, path: str, text: str, key: str | None):
    extra = {} if key is None else {"idempotency_key": key}
    try:
        with kb.transaction(ws, f"write {path}", "stress", **extra) as tx:
            tx.write(path, text)
        return tx.revision
    except KbError as exc:
        return exc


def stress_outcomes(
    kb: KnowledgeBase, ws: int, seconds: float, writers: int = 2, seed: int = 0, targets: str = "all"
) -> OutcomeReport:
    """Run the writers and the killer for ``seconds``, then check every answer (see the module).
    ``targets``: ``"all"`` client backends of the database, or only the ``"busy"`` ones (inside
    a transaction)."""
    report, lock = OutcomeReport(), threading.Lock()
    answers: list[tuple[str, object, str | None]] = []
    retries: dict[str, object] = {}
    stop = threading.Event()
    keys = _takes_keys(kb)
    kb.create_workspace(ws)

    def writer(n: int) -> None:
        own = KnowledgeBase(kb.settings, kb.database_url)
        i = 0
        while not stop.is_set():
            path, key = f"/documents/w{n}/{i}.md", (f"w{n}-{i}" if keys else None)
            answer = _write(own, ws, path, f"{n} {i} first\n", key)
            if isinstance(answer, KbError):
                retries[path] = _write(own, ws, path, f"{n} {i} retry\n", key)  # as a caller would
            with lock:
                answers.append((path, answer, key))
            i += 1
        own.close()

    def killer() -> None:
        rng = random.Random(seed)
        while not stop.is_set():
            time.sleep(rng.uniform(0.1, 0.6))
            try:
                with psycopg.connect(kb.database_url, autocommit=True) as conn:
                    report.counts["kills"] += len(conn.execute(queries[TERMINATE[targets]]).fetchall())
            except psycopg.Error:
                pass

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(writers)]
    threads.append(threading.Thread(target=killer))
    run_for(threads, seconds, stop, 120)
    from kb.db import database

    database.close_pools()
    revisions_of: dict[str, list[str]] = {}
    for revision in kb.history(ws, limit=1_000_000):
        for change in revision.changes:
            revisions_of.setdefault(change.path, []).append(revision.id)
    for path, answer, key in answers:
        report.counts["writes"] += 1
        n, i = path.split("/w", 1)[1].split(".")[0].split("/")
        first = f"{n} {i} first\n".encode()
        revisions = revisions_of.get(path, [])
        first_landed = any(_read(kb, ws, r, path) == first for r in revisions)
        if len(revisions) > 1:
            report.fault(
                "applied_twice", f"{path}: {type(answer).__name__}, retried, changed in {len(revisions)} revisions"
            )
        if isinstance(answer, CommitOutcomeUnknown):
            report.counts["unknown"] += 1
            if keys and (kb.write_outcome(ws, key) is not None) != first_landed:
                report.fault("unknown_settled_wrongly", path)
        elif isinstance(answer, KbError):
            report.counts[f"error {type(answer).__name__}"] += 1
            if first_landed:
                report.fault("misreported", f"{path}: {type(answer).__name__} but it landed")
        elif answer is None or not first_landed or answer.id not in revisions:
            report.fault("misreported", f"{path}: reported landed as {answer} but it did not")
        else:
            report.counts["landed"] += 1
    return report


def _read(kb: KnowledgeBase, ws: int, revision: str, path: str) -> bytes | None:
    try:
        return kb.read_as_of(ws, revision, path)
    except KbError:
        return None
