"""(design §14) a small, still meaningful sample of each adversarial run in ``bin/adversarial_store.py``
(the full runs — 32 × 100 writers, 100 SIGKILLs, 2,000 fuzzed paths — are for the closing note).
Each run builds its own database on the test server and exits 1 when an invariant broke."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "bin" / "adversarial_store.py"


@pytest.mark.parametrize(
    "args",
    [
        ["writers", "--writers", "4", "--revisions", "8"],
        ["kills", "--kills", "5"],
        ["fuzz", "--paths", "150"],
        ["fsck-load", "--runs", "3", "--writers", "2"],
    ],
    ids=["writers", "kills", "fuzz", "fsck-load"],
)
def test_adversarial_sample(pg_server, args):
    env = {k: v for k, v in os.environ.items() if not k.startswith("KB_")}
    env.update(KB_DATABASE_URL=pg_server, PYTHONPATH=str(SCRIPT.parents[1]))
    result = subprocess.run([sys.executable, str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().endswith("OK")
    assert "escaped 0" in result.stdout or args[0] in ("kills", "fsck-load")
