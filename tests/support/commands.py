"""The real programs a test runs as a user would: the ``kb`` CLI and the git CLI."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
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


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] == "T"


@contextlib.contextmanager
def halted_cli(env: dict[str, str], point: str, *args: str) -> Iterator[subprocess.Popen]:
    """``kb ARGS`` run until it halts at the fault point ``point`` (``KB_FAULT_SIGNAL=STOP``,
    kb/faults.py); yields the stopped process (text pipes), for the block to act in the gap and
    send SIGCONT. Killed if the block leaves it running. Raises AssertionError when it ends
    instead of halting within 300 s."""
    process = subprocess.Popen(
        [sys.executable, "-m", "kb.adapters.cli", *args],
        env={**env, "KB_FAULT_POINT": point, "KB_FAULT_SIGNAL": "STOP"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 300
        while process.poll() is None and not _stopped(process.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert process.poll() is None and _stopped(process.pid), process.communicate()
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


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
