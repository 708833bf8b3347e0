"""design §13: ``kb serve --with-worker`` runs the worker in its event loop and logs a line per job
on stderr, as ``kb worker`` does off a terminal, so an operator reading the server's log sees the
projection and index jobs a write caused (it logged nothing per job before)."""

from __future__ import annotations

import os
import re

import psycopg
import pytest
from support.database import fresh_database
from support.kb_server import running_server
from support.waiting import wait_until

from kb.knowledge_base import KnowledgeBase
from kb.settings import Settings

pytest.importorskip("fastapi", reason="kb serve needs the serve extra (pip install -e '.[serve]')")


def test_serve_with_worker_logs_each_job(pg_server, template_url, tmp_path):
    template = psycopg.conninfo.conninfo_to_dict(template_url)["dbname"]
    with fresh_database(pg_server, template) as url:
        settings = Settings(database_url=url, storage_root=tmp_path / "storage", embedding_model="hashing")
        env = {k: v for k, v in os.environ.items() if not k.startswith("KB_")}
        env.update(KB_DATABASE_URL=url, KB_STORAGE_ROOT=str(settings.storage_root), KB_EMBEDDING_MODEL="hashing")
        log = tmp_path / "serve.log"
        with running_server(env, log, "--insecure-no-auth"):
            with KnowledgeBase.open(settings) as kb:
                kb.create_workspace(1)
                with kb.transaction(1, "a note", "tester") as tx:
                    tx.write("/documents/note.md", "# Note\n\nsomething to index\n")
                wait_until(
                    lambda: re.search(r"job \d+ kb\.index\S* \(workspace 1\) done", log.read_text()),
                    120,
                    "the server's log to show the index job",
                )
        text = log.read_text()
        assert re.search(r"job \d+ kb\.project\S* \(workspace 1\) done", text), text
