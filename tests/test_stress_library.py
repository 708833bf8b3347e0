"""CI sample of ``bin/stress_library.py`` (design §4, §14): 4 threads sharing one KnowledgeBase for
20 s — transactions, turns, moves, reads, searches, ``kb.index`` — beside a ``git repack -ad`` loop
and Postgres sessions ended every few seconds. Every write's reported outcome is checked against git
and ``kb.revisions``; the index against git."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "bin" / "stress_library.py"
KNOWN_RAW = ("cannot exit pipeline mode while busy", "configure_connection")
"""Raw psycopg errors the stress run meets when a session ends at an unlucky moment, not fixed here
(no deterministic reproduction yet): inside ``Projector._many``'s pipelined batch the connection is
not yet marked broken, so ``kb.db.database`` does not translate it; and ``database.connect`` turns a
failed connect into DatabaseUnavailable but not a session ended during ``configure_connection``."""


def load_script():
    spec = importlib.util.spec_from_file_location("stress_library", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("stress_library", module)
    spec.loader.exec_module(module)
    return module


def test_threads_sharing_one_knowledge_base_under_repacks_and_connection_kills(kb, capsys):
    stress_library = load_script()
    stress = stress_library.Stress(kb, threads=4, seconds=20, op_timeout=60, repack_every=1.0, kill_every=2.0)
    stress.run()
    report = stress.check()
    stress_library.print_report(report, 12, 4)
    with capsys.disabled():
        print(capsys.readouterr().out)
    assert report.corrupt_index == []
    assert report.hangs == []
    assert report.lost == [] and report.phantom == []
    unknown_raw = [e for e in report.raw_errors if not any(known in e for known in KNOWN_RAW)]
    assert unknown_raw == []
    assert report.git_fsck == ""
    assert report.status_lines == 0
    assert report.fsck_repairs["index rebuilt"] is None and report.fsck_repairs["working tree paths"] == 0
    assert sum(o.reported == "landed" for o in report.outcomes) > 20
    misreports = report.nothing_recorded_landed + report.dropped_connection_landed
    if misreports:  # truthful group-commit outcomes under dropped connections: branch ``outcomes``
        pytest.xfail(f"{len(misreports)} writes were refused after a dropped connection but landed: {misreports[0]}")
    if report.raw_errors:
        pytest.xfail(f"a session ended at an unlucky moment escaped raw: {report.raw_errors[0]}")
