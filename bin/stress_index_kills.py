#!/usr/bin/env python
"""Bulk index runs killed for real (design §7, §8): ``kb index`` processes SIGKILLed in the middle
of a bulk run (one that defers the term statistics, kb.deferred_term_stats, and drops the
workspace's HNSW index), while a second workspace indexes at once, a writer commits to the first
and searches of it must answer. After each round the deferral is ended by the next run or by
the sweep (alternately), and then:

* kb.lexeme_stats, kb.text_stats, kb.document_lexeme_stats and kb.document_text_stats of both
  workspaces equal a fresh recount of their chunks and kb.document_terms rows;
* no deferral is left;
* the first workspace's HNSW index is recorded and valid again once it has ``HNSW_MIN_CHUNKS``
  chunks (by the next run, or by the maintenance job the sweep queued, run here);
* every search during the runs answered (no error; results when the workspace has chunks).

Exit 1 when one breaks. Postgres: ``KB_DATABASE_URL`` (a fresh database is created there), else an
embedded server. Example::

    KB_DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres \\
        python bin/stress_index_kills.py --rounds 4 --documents 1500
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

STATS = (
    ("test_lexeme_stats", "test_lexeme_recount", "chunk_count"),
    ("test_document_lexeme_stats", "test_document_lexeme_recount", "document_count"),
)


def kb_index(env: dict, ws: int) -> subprocess.Popen:
    """``kb index --workspace ws`` in its own process (this tree's kb)."""
    return subprocess.Popen(
        [sys.executable, "-m", "kb.adapters.cli", "index", "--workspace", str(ws)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def stats_problems(kb, ws: int) -> list[str]:
    """Where the kept statistics of ``ws`` differ from a recount (and the totals from the rows)."""
    from support.generated_documents import named_rows

    problems = []
    for kept, recount, count in STATS:
        a = {(r["text_config"], r["lexeme"]): r[count] for r in named_rows(kb, kept, workspace_id=ws)}
        b = {(r["text_config"], r["lexeme"]): r[count] for r in named_rows(kb, recount, workspace_id=ws)}
        if a != b:
            differ = [k for k in a.keys() | b.keys() if a.get(k) != b.get(k)]
            problems.append(
                f"workspace {ws}: {kept} differs from a recount at {len(differ)} lexemes, e.g. {differ[:3]}"
            )
    [totals] = named_rows(kb, "test_text_stats_check", workspace_id=ws)
    if (totals["kept_chunks"], totals["kept_length"]) != (totals["chunks"], totals["length"]):
        problems.append(f"workspace {ws}: kb.text_stats {dict(totals)}")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--documents", type=int, default=1500, help="new documents per workspace per round")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    logging.getLogger("psycopg").setLevel(logging.CRITICAL)
    from bench_store import database
    from support.generated_documents import generated_corpus, named_rows

    from kb.errors import KbError
    from kb.index import vector_index
    from kb.knowledge_base import KnowledgeBase
    from kb.settings import Settings

    rng = random.Random(args.seed)
    problems: list[str] = []
    figures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="kb-index-kills-") as tmp:
        url, cleanup = database(Path(tmp))
        storage = Path(tmp) / "storage"
        env = {
            **os.environ,
            "KB_DATABASE_URL": url,
            "KB_STORAGE_ROOT": str(storage),
            "KB_EMBEDDING_MODEL": "hashing",
            "PYTHONPATH": str(ROOT),
        }
        try:
            kb = KnowledgeBase.open(Settings(database_url=url, storage_root=storage, embedding_model="hashing"))
            for ws in (1, 2):
                kb.create_workspace(ws)
            model = kb.embedder.model
            sizes = [args.documents * 2**r for r in range(args.rounds)]  # each round a bulk run again
            corpus = list(generated_corpus(sum(sizes)).items())
            searches = {"answered": 0, "empty": 0, "errors": []}
            for round_no in range(args.rounds):
                part = corpus[sum(sizes[:round_no]) : sum(sizes[: round_no + 1])]
                vector_index.forget_cached()
                had_index = bool(named_rows(kb, "recorded_vector_index", workspace_id=1, model=model))
                had_chunks = named_rows(kb, "workspace_model_chunks", workspace_id=1, model=model)[0]["n"] > 0
                for ws in (1, 2):  # more new documents than indexed ones: a bulk run
                    with kb.transaction(ws, f"import {round_no}", "stress") as tx:
                        for path, text in part:
                            tx.write(path.replace("/documents/", f"/documents/r{round_no}/"), text)
                stop = threading.Event()

                def search_and_write() -> None:
                    n = 0
                    while not stop.is_set():
                        try:
                            found = kb.search(1, rng.choice(["the", "index run", "ranking"]), k=5)
                            searches["answered" if found else "empty"] += 1
                            if had_chunks and not found:
                                searches["errors"].append(
                                    f"round {round_no}: no result though the workspace has chunks"
                                )
                        except KbError as exc:
                            searches["errors"].append(f"{type(exc).__name__}: {exc}"[:200])
                        if n % 5 == 0:  # a writer committing during the bulk run
                            with kb.transaction(1, f"during {round_no}.{n}", "stress") as tx:
                                tx.write(f"/documents/during/{round_no}-{n}.md", f"# During\n\nwritten in run {n}\n")
                        n += 1
                        time.sleep(0.05)

                helper = threading.Thread(target=search_and_write, daemon=True)
                victim, other = kb_index(env, 1), kb_index(env, 2)
                helper.start()
                waited = time.monotonic() + 60  # until the run is in its bulk load, then a little more
                while victim.poll() is None and time.monotonic() < waited:
                    if 1 in [r["workspace_id"] for r in named_rows(kb, "deferred_term_stats_workspaces")]:
                        break
                    time.sleep(0.05)
                time.sleep(rng.uniform(0.0, 1.5))
                killed = victim.poll() is None
                if killed:
                    victim.send_signal(signal.SIGKILL)
                victim.wait()
                other_rc = other.wait(600)
                stop.set()
                helper.join(60)
                if other_rc != 0:
                    problems.append(
                        f"round {round_no}: kb index of workspace 2 exited {other_rc}: {other.stderr.read()[-300:]}"
                    )
                deferred = bool(named_rows(kb, "deferred_term_stats_workspaces"))
                repair = "sweep" if round_no % 2 else "next run"
                if repair == "sweep":
                    report = kb.sweep()
                    figures.append(
                        f"round {round_no}: killed={killed}, deferred={deferred}, sweep recounted {report.term_stats_recounted}"
                    )
                    kb.run_worker(until_idle=True)  # the index and vector-index jobs the sweep queued
                else:
                    rc = kb_index(env, 1).wait(600)
                    figures.append(f"round {round_no}: killed={killed}, deferred={deferred}, next run exited {rc}")
                kb.index(2)
                kb.index(1)  # the writer's last commits
                if named_rows(kb, "deferred_term_stats_workspaces"):
                    problems.append(f"round {round_no}: a deferral is left after the {repair}")
                for ws in (1, 2):
                    problems += [f"round {round_no} ({repair}): {p}" for p in stats_problems(kb, ws)]
                [chunks] = named_rows(kb, "workspace_model_chunks", workspace_id=1, model=model)
                vector_index.forget_cached()
                recorded = named_rows(kb, "recorded_vector_index", workspace_id=1, model=model)
                if had_index and not recorded:
                    problems.append(f"round {round_no} ({repair}): the HNSW index is not built again after the repair")
                figures[-1] += (
                    f", {chunks['n']} chunks, hnsw before={'yes' if had_index else 'no'} after={'yes' if recorded else 'no'}"
                )
                vector_index.maintain(url, 1, model, kb.embedder.dim)  # what the worker's job does after a run
            if searches["errors"]:
                problems.append(f"searches during the runs failed: {searches['errors'][:3]}")
            figures.append(f"searches during the runs: {searches['answered']} answered, {searches['empty']} empty")
            kb.close()
        finally:
            from kb.db import database as db

            db.close_pools()
            cleanup()
    for line in figures:
        print(line)
    for problem in problems[:30]:
        print("PROBLEM", problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
