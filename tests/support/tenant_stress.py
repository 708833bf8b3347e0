"""Tenants side by side on one ``kb serve`` (design §5, §16): each tenant is a write token for a
workspace of its own; each of its client threads opens turns, writes, reads back, edits, removes
and commits them with an idempotency key, while a slow writer now and then holds one tenant's
write lock. Used by ``bin/stress_serve_tenants.py`` (figures) and its CI sample
(tests/test_serve_tenants_stress.py).

What must hold for every turn, whatever ran beside it:

- ``own_view``: a turn reads back what it wrote (its own writes, no one else's);
- ``misreported``: a commit answered 200 names a revision of its own workspace that holds exactly
  the turn's files with its contents; one answered with an error other than an unknown outcome
  landed nothing (the retry with the same key tells); an unknown outcome is settled by
  ``writes/{key}`` and must agree with git;
- ``applied_twice``: a retried commit never records a second revision of the same key;
- ``crossed``: no tenant's path appears in another tenant's workspace.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx
import psycopg

from kb.db.locks import WRITE_LOCK_NAMESPACE
from kb.knowledge_base import KnowledgeBase

from .named_queries import queries
from .waiting import run_for  # relative: bin/stress_serve_tenants.py imports this as tests.support


@dataclass
class TenantReport:
    """What was counted (``counts``), per-call latencies in seconds (``latencies``, by call) and
    the faults found (``faults``, up to 20 lines)."""

    counts: Counter = field(default_factory=Counter)
    latencies: dict[str, list[float]] = field(default_factory=dict)
    faults: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def fault(self, kind: str, text: str) -> None:
        with self._lock:
            self.counts[kind] += 1
            if len(self.faults) < 20:
                self.faults.append(f"{kind}: {text}")

    def count(self, kind: str, n: int = 1) -> None:
        with self._lock:
            self.counts[kind] += n

    def timed(self, call: str, seconds: float) -> None:
        with self._lock:
            self.latencies.setdefault(call, []).append(seconds)


def _auth(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def stress_tenants(
    kb: KnowledgeBase,
    url: str,
    tenants: list[tuple[int, str]],
    seconds: float,
    threads: int = 2,
    seed: int = 0,
    hold_seconds: float = 0.5,
) -> TenantReport:
    """Run ``threads`` client threads per tenant (``(workspace id, write token secret)``) against
    the ``kb serve`` at ``url`` for ``seconds``, while a slow writer holds a random tenant's
    write lock for ``hold_seconds`` now and then (0: never); then check every answer against
    what landed (see the module). ``kb`` reads the workspaces' history."""
    report = TenantReport()
    stop = threading.Event()
    commits: list[tuple[int, str, dict[str, str], str, object]] = []  # ws, key, files, turn, answer
    commits_lock = threading.Lock()

    def client(ws: int, secret: str, n: int) -> None:
        rng = random.Random(seed * 1000 + ws * 10 + n)
        api = httpx.Client(base_url=url, timeout=120, headers=_auth(secret))
        i = 0
        try:
            while not stop.is_set():
                turn, key = f"c{n}-{i}", f"w{ws}-c{n}-{i}"
                base = f"/v1/workspaces/{ws}/turns/{turn}"
                files: dict[str, str] = {}
                for k in range(rng.randint(1, 3)):
                    path = f"/documents/ws{ws}/c{n}/{i}-{k}.md"
                    text = f"ws {ws} client {n} turn {i} file {k}\nline two\n"
                    started = time.perf_counter()
                    put = api.put(f"{base}/files{path}", json={"content": text})
                    report.timed("write", time.perf_counter() - started)
                    if put.status_code != 200:
                        report.count(f"write {put.status_code}")
                        continue
                    files[path] = text
                for path, text in list(files.items()):
                    started = time.perf_counter()
                    got = api.get(f"{base}/files{path}")
                    report.timed("read", time.perf_counter() - started)
                    lines = [line for _, line in got.json().get("lines", [])] if got.status_code == 200 else None
                    if lines != text.splitlines():
                        report.fault("own_view", f"{path} in turn {turn}: {got.status_code} {got.text[:120]}")
                if files and rng.random() < 0.3:  # an edit of one file
                    path = rng.choice(sorted(files))
                    edited = api.post(f"{base}/edit{path}", json={"old": "line two", "new": "line 2"})
                    if edited.status_code == 200:
                        files[path] = files[path].replace("line two", "line 2")
                if len(files) > 1 and rng.random() < 0.2:  # a removal
                    path = rng.choice(sorted(files))
                    if api.delete(f"{base}/files{path}").status_code == 200:
                        del files[path]
                started = time.perf_counter()
                answer: object = _commit(api, base, key)
                report.timed("commit", time.perf_counter() - started)
                with commits_lock:
                    commits.append((ws, key, files, turn, answer))
                if not isinstance(answer, dict):
                    api.delete(base)  # a turn whose commit failed stays open for a retry: this client ends it
                i += 1
        finally:
            api.close()

    def slow_writer() -> None:
        rng = random.Random(seed)
        while not stop.is_set() and hold_seconds > 0:
            time.sleep(rng.uniform(0.2, 1.0))
            ws = rng.choice(tenants)[0]
            try:
                with psycopg.connect(kb.database_url) as conn:
                    conn.execute(
                        queries["test_hold_advisory_lock"], {"namespace": WRITE_LOCK_NAMESPACE, "workspace_id": ws}
                    )
                    report.count("lock holds")
                    stop.wait(hold_seconds)
            except psycopg.Error:
                pass

    workers = [threading.Thread(target=client, args=(ws, secret, n)) for ws, secret in tenants for n in range(threads)]
    workers.append(threading.Thread(target=slow_writer))
    run_for(workers, seconds, stop, 300)
    _check(kb, url, tenants, commits, report)
    return report


def _commit(api: httpx.Client, base: str, key: str) -> object:
    """The commit's answer: the JSON of a 200, else ``(status, error name)``; a 503 or a lost
    connection is retried once with the same key, as a client would."""
    for attempt in range(2):
        try:
            response = api.post(f"{base}/commit", json={"message": key}, headers={"Idempotency-Key": key})
        except httpx.HTTPError as exc:
            answer: object = (0, type(exc).__name__)
        else:
            if response.status_code == 200:
                return response.json()
            answer = (response.status_code, response.json().get("error"))
        if attempt == 0 and answer[0] in (0, 503):  # type: ignore[index]
            continue
        return answer
    return answer


def _check(
    kb: KnowledgeBase,
    url: str,
    tenants: list[tuple[int, str]],
    commits: list[tuple[int, str, dict[str, str], str, object]],
    report: TenantReport,
) -> None:
    secrets = dict(tenants)
    landed: dict[int, dict[str, list]] = {}  # ws -> key -> revisions recorded with it
    for ws, _ in tenants:
        by_key: dict[str, list] = {}
        for revision in kb.history(ws, limit=1_000_000):
            first = revision.message.splitlines()[0] if revision.message else ""
            by_key.setdefault(first, []).append(revision)
            for change in revision.changes:
                if not change.path.startswith(f"/documents/ws{ws}/"):
                    report.fault("crossed", f"{change.path} in workspace {ws}")
        landed[ws] = by_key
    for ws, key, files, _turn, answer in commits:
        report.count("commits")
        revisions = landed[ws].get(key, [])
        if len(revisions) > 1:
            report.fault("applied_twice", f"{key}: {len(revisions)} revisions")
        if isinstance(answer, dict):
            rid = answer.get("revision")
            if not files:
                report.count("empty")
                continue
            mine = [r for r in revisions if r.id == rid]
            if not mine:
                report.fault("misreported", f"{key}: answered {rid}, which is not its workspace's revision of the key")
                continue
            report.count("landed")
            for path, text in files.items():
                if kb.read_as_of(ws, rid, path).decode() != text:
                    report.fault("misreported", f"{key}: {path} in {rid} is not what the turn wrote")
            changed = {c.path for c in mine[0].changes}
            if changed != set(files):
                report.fault("misreported", f"{key}: {rid} changed {sorted(changed)}, the turn wrote {sorted(files)}")
        else:
            status, error = answer  # type: ignore[misc]
            report.count(f"error {status} {error}")
            if error != "CommitOutcomeUnknown" and revisions:
                report.fault("misreported", f"{key}: answered {status} {error}, but it landed in {revisions[0].id}")
            settle = httpx.get(f"{url}/v1/workspaces/{ws}/writes/{key}", headers=_auth(secrets[ws]), timeout=120)
            said = settle.json().get("landed") if settle.status_code == 200 else None
            if said is None:
                report.fault("misreported", f"{key}: settle answered {settle.status_code} {settle.text[:120]}")
            elif bool(said) != bool(revisions):
                report.fault(
                    "misreported", f"{key}: {status} {error}, settle says landed={said}, git has {len(revisions)}"
                )
