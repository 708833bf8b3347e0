"""(design §10) ``kb seed`` / ``kb spans`` / ``kb drift`` as a user runs them (real CLI subprocesses), on
the whole test corpus, whose legacy model differs from the active one (re-embedded through the cache), and
the drift check repairing Postgres-side drift of a flipped workspace."""

from __future__ import annotations

import json

import psycopg
import pytest
from support.commands import git, run_cli
from support.legacy import LegacyHashEmbedder, all_pages, drop_legacy, make_legacy
from support.named_queries import queries

from kb.knowledge_base import KnowledgeBase


@pytest.fixture(scope="module")
def corpus_legacy(pg_server):
    made = make_legacy(pg_server, all_pages(), workspace=2)
    yield made
    drop_legacy(pg_server, made[0])


def test_cli_dry_run_seed_flip_status_spans_and_model_mismatch(kb_env, settings, corpus_legacy, tmp_path):
    dsn, summary = corpus_legacy
    dry = run_cli(kb_env, "seed", "--from-dsn", dsn, "--legacy-workspace", "2", "-w", "4")
    assert "dry run" in dry.stdout and "nothing written" in dry.stdout
    assert "blank    legacy" in dry.stdout and "pending  legacy" in dry.stdout
    assert "chunks to re-embed" in dry.stdout  # hashing is active, the legacy model is legacy-hash-384
    assert "password" not in dry.stdout

    out = tmp_path / "report.jsonl"
    done = run_cli(
        kb_env, "seed", "--from-dsn", dsn, "--legacy-workspace", "2", "-w", "4", "--yes", "--flip", "--out", str(out)
    )
    assert "parity:     ok" in done.stdout and "authority:  kb (flipped)" in done.stdout
    assert "re-embeds" in done.stderr  # the count, before anything was written
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines[-1]["summary"]["parity"]["ok"] and len(lines) - 1 == summary["documents"]
    skipped = {line["legacy_id"]: line["reason"] for line in lines[:-1] if line["outcome"] == "skipped"}
    assert skipped == {summary["quirks"]["blank"][0]: "blank", summary["quirks"]["pending"][0]: "pending"}

    kb = KnowledgeBase.open(settings)
    assert git(kb.store(4).path, "log", "--format=%an", "-1").strip() == "kb-migration"
    refused = run_cli(kb_env, "seed", "--from-dsn", dsn, "--legacy-workspace", "2", "-w", "4", "--yes", check=False)
    assert refused.returncode == 1 and "--force" in refused.stderr and "Traceback" not in refused.stderr
    status = run_cli(kb_env, "status", "-w", "4").stdout
    assert "authority:  kb (flipped" in status and "parity ok" in status

    # models differ: nothing adopted, the worker re-embeds every document with the active model
    with psycopg.connect(kb.database_url) as conn:
        assert conn.execute(queries["test_count_workspace_chunks"], {"workspace_id": 4}).fetchone()[0] == 0
    run_cli(kb_env, "worker", "--until-idle")
    with psycopg.connect(kb.database_url) as conn:
        states = conn.execute(queries["test_document_status_counts"], {"workspace_id": 4}).fetchall()
        assert states == [("indexed", len(lines) - 1 - len(skipped))]
        assert conn.execute(queries["test_count_chunks_without_spans"], {"workspace_id": 4}).fetchone()[0] == 0
    spans = run_cli(kb_env, "spans", "status", "-w", "4").stdout
    assert "span fill:  active" in spans and "0 chunks / 0 documents without spans" in spans
    assert "paused" in run_cli(kb_env, "spans", "pause").stdout
    assert "PAUSED" in run_cli(kb_env, "spans", "status").stdout
    assert "resumed" in run_cli(kb_env, "spans", "resume").stdout
    assert "filled 0 documents" in run_cli(kb_env, "spans", "run-once").stdout
    assert "workspace 4: no drift" in run_cli(kb_env, "drift", "-w", "4").stdout
    unflip = run_cli(kb_env, "seed", "--unflip", "-w", "4").stdout
    assert "handed back" in unflip
    bad = run_cli(kb_env, "seed", "-w", "4", check=False)
    assert bad.returncode == 1 and "--from-dsn" in bad.stderr


def test_drift_check_repairs_postgres_only_and_is_capped(kb, corpus_legacy):
    kb.use_embedder(LegacyHashEmbedder())
    dsn, _ = corpus_legacy
    kb.seed(dsn, 2, 8, yes=True, flip=True)
    head = kb.head(8)
    clean = kb.drift_check()
    assert [r.as_dict()["findings"] for r in clean] == [{}]
    with psycopg.connect(kb.database_url) as conn:
        paths = [r[0] for r in conn.execute(queries["test_first_document_paths"], {"workspace_id": 8, "n": 3})]
        conn.execute(queries["test_delete_document_row"], {"path": paths[0]})
        conn.execute(queries["test_corrupt_document_content_ids"], {"path": paths[1]})
        conn.execute(queries["test_corrupt_indexed_content_id"], {"path": paths[2]})
    kb.settings.drift_max_repairs = 1
    capped = kb.drift_check(8)[0]
    assert capped.capped and capped.repaired == 1  # two row findings exceed the cap; one index finding fits
    kinds = {(f["kind"], f["path"]): f["repaired"] for f in capped.findings}
    assert kinds == {
        ("missing_row", paths[0]): False,
        ("content_mismatch", paths[1]): False,
        ("index_mismatch", paths[2]): True,
    }
    assert {r["kind"] for r in kb.status(8)["workspace"]["drift"]} >= {"missing_row", "content_mismatch"}

    kb.settings.drift_max_repairs = 100
    repaired = kb.drift_check(8)[0]
    assert not repaired.capped and repaired.repaired == len(repaired.findings) > 0
    assert kb.head(8) == head  # git untouched
    kb.index(8)  # the re-queued documents are re-indexed
    assert [r.as_dict()["findings"] for r in kb.drift_check(8)] == [{}]
    with psycopg.connect(kb.database_url) as conn:
        assert conn.execute(queries["test_count_documents_at"], {"workspace_id": 8, "paths": paths}).fetchone()[0] == 3
