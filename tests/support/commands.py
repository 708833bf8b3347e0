"""The real programs a test runs as a user would: the ``kb`` CLI and the git CLI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def run_cli(env: dict[str, str], *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run ``python -m kb.adapters.cli ARGS`` with ``env``; returns the completed process.

    Raises AssertionError with the command's stderr when ``check`` and it exits non-zero."""
    result = subprocess.run(
        [sys.executable, "-m", "kb.adapters.cli", *args], env=env, capture_output=True, text=True, timeout=600
    )
    if check and result.returncode != 0:
        raise AssertionError(f"kb {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
    return result


def git(repo: Path, *args: str) -> str:
    """Run the real git CLI in ``repo``; returns stdout (raises CalledProcessError on failure)."""
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def missing_objects(repo: Path, ids: list[str]) -> list[str]:
    """The object ids among ``ids`` the real git CLI cannot find in ``repo`` (``cat-file --batch-check``)."""
    checked = subprocess.run(
        ["git", "-C", str(repo), "cat-file", "--batch-check"],
        input="\n".join(ids) + "\n",
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [line.split()[0] for line in checked.splitlines() if line.endswith(" missing")]
