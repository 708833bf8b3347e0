"""Keyed retries at once (design §3, "A retry while the first is in flight"): several processes,
each with several threads, send the same write with the same idempotency key — as transactions and
as turn commits — while other threads write under keys of their own (group commit), and in some
rounds one process is SIGKILLed at the ``draft_ready`` fault point (holding the key's fence). Every
answer a caller got for the key must name one revision, git must hold exactly one commit of the key,
and no caller may get an error. Used by ``bin/stress_keyed_retries.py`` and its CI sample
(tests/test_keyed_retry_stress.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from kb.knowledge_base import KnowledgeBase

CHILD = r"""
import json, os, sys, threading
from kb.errors import KbError
from kb.knowledge_base import KnowledgeBase
from kb.settings import Settings
cfg = json.loads(sys.argv[1])
kb = KnowledgeBase.open(Settings(database_url=cfg["url"], storage_root=cfg["root"], embedding_model="hashing"), migrate=False)
answers = []
def send(i):
    key, path = cfg["key"], "/documents/" + cfg["path"]
    try:
        if i % 3 == 0:
            turn = kb.turn(cfg["ws"], f"p{os.getpid()}-{i}", "w")
            turn.write(path, f"the write of {key}\n")  # a retry sends the same change
            result = turn.commit("the same write", idempotency_key=key)
            answers.append(["key", None if result is None else result.revision])
        elif i % 3 == 1:
            with kb.transaction(cfg["ws"], "the same write", "w", idempotency_key=key) as tx:
                tx.write(path, f"the write of {key}\n")
            answers.append(["key", None if tx.revision is None else tx.revision.id])
        else:
            other = f"other-{os.getpid()}-{i}"
            with kb.transaction(cfg["ws"], "another write", "w", idempotency_key=other) as tx:
                tx.write(f"/documents/{other}.md", "o\n")
            answers.append(["other", tx.revision.id])
    except KbError as exc:
        answers.append(["error", f"{type(exc).__name__}: {exc}"[:200]])
threads = [threading.Thread(target=send, args=(i,)) for i in range(cfg["threads"])]
for t in threads: t.start()
for t in threads: t.join()
kb.close()
print(json.dumps(answers))
"""


@dataclass
class KeyedRetryReport:
    """Counts over the rounds (``answers``, ``killed`` processes, ``bad_rounds``) and what went wrong."""

    counts: Counter = field(default_factory=Counter)
    faults: list[str] = field(default_factory=list)


def _commits_of_key(repository: Path, key: str) -> int:
    """Commits on any ref whose ``kb-write-key`` header is ``key`` (design §3)."""
    headers = subprocess.run(
        ["git", "-C", str(repository), "rev-list", "--all", "--header"], capture_output=True, text=True, check=True
    ).stdout
    return sum(1 for line in headers.splitlines() if line.strip() == f"kb-write-key {key}")


def stress_keyed_retries(
    kb: KnowledgeBase, workspace_id: int, rounds: int, processes: int, threads: int, kill_every: int = 2
) -> KeyedRetryReport:
    """Run ``rounds`` rounds of ``processes`` × ``threads`` senders on ``workspace_id`` (created by
    the caller, with a first revision); every ``kill_every``-th round one process is killed holding
    the key's fence. Returns the report (``counts["bad_rounds"]`` 0 when every round held)."""
    report = KeyedRetryReport()
    settings = kb.settings
    repository = settings.knowledge_store / str(workspace_id)
    for round_number in range(rounds):
        key = f"same-write-{round_number}"
        config = {
            "url": kb.database_url,
            "root": str(settings.storage_root),
            "ws": workspace_id,
            "key": key,
            "path": f"round-{round_number}.md",
            "threads": threads,
        }
        senders = []
        for number in range(processes):
            env = {k: v for k, v in os.environ.items() if not k.startswith("KB_FAULT")}
            if number == 0 and kill_every and round_number % kill_every == 0:
                env["KB_FAULT_POINT"] = "draft_ready"
            senders.append(
                subprocess.Popen(
                    [sys.executable, "-c", CHILD, json.dumps(config)],
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        answers, errors = [], []
        for sender in senders:
            out, err = sender.communicate(timeout=600)
            if sender.returncode != 0:
                report.counts["killed"] += 1
                if sender.returncode != -9:
                    errors.append(f"a sender exited {sender.returncode}: {err.strip()[-300:]}")
                continue
            for kind, value in json.loads(out):
                if kind == "key":
                    answers.append(value)
                elif kind == "error":
                    errors.append(value)
                report.counts[kind] += 1
        commits = _commits_of_key(repository, key)
        held = len(set(answers)) == 1 and None not in answers and commits == 1 and not errors
        if not held:
            report.counts["bad_rounds"] += 1
            report.faults.append(
                f"round {round_number}: {len(answers)} answers, {len(set(answers))} revisions, "
                f"{answers.count(None)} None, {commits} commits of the key, errors {errors[:2]}"
            )
        report.counts["rounds"] += 1
    fsck = subprocess.run(["git", "-C", str(repository), "fsck", "--strict"], capture_output=True, text=True)
    if fsck.returncode != 0:
        report.counts["bad_rounds"] += 1
        report.faults.append(f"git fsck --strict: {fsck.stderr.strip()[-300:]}")
    return report
