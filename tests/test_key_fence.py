"""The write-key fence (design §3, ``kb.git.key_fence``) on its own: real files, threads and
processes, in both of its forms — Linux's open-file-description byte locks, one per key, and the
``flock`` stripes of a system without them (macOS), selected here by ``BYTE_LOCKS``."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from kb.git import key_fence as fence
from kb.git.key_fence import KeyFenceTimeout, key_fence


@pytest.fixture(params=[True, False], ids=["byte-locks", "stripes"])
def byte_locks(request, monkeypatch) -> bool:
    if request.param and not hasattr(__import__("fcntl"), "F_OFD_SETLK"):
        pytest.skip("no open-file-description locks on this system")
    monkeypatch.setattr(fence, "BYTE_LOCKS", request.param)
    return request.param


@pytest.fixture
def git_dir(tmp_path: Path) -> Path:
    (tmp_path / ".git").mkdir()
    return tmp_path / ".git"


def _one_stripe() -> tuple[str, str]:
    seen: dict[int, str] = {}
    for n in range(10_000):
        key = f"k-{n}"
        stripe = fence.key_offset(key) % fence.STRIPES
        if stripe in seen:
            return seen[stripe], key
        seen[stripe] = key
    raise AssertionError("unreachable")


def _held_elsewhere(git_dir: Path, key: str, byte_locks: bool) -> bool:
    """Whether another process finds ``key``'s fence held (it waits 0.3 s for it)."""
    code = (
        "import sys; from pathlib import Path; from kb.git import key_fence as f\n"
        f"f.BYTE_LOCKS = {byte_locks}\n"
        "try:\n"
        f"    with f.key_fence(Path({str(git_dir)!r}), {key!r}, 0.3): print('free')\n"
        "except f.KeyFenceTimeout: print('held')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip() == "held"


def test_a_key_is_held_against_other_threads_and_processes_until_released(byte_locks, git_dir) -> None:
    taken, release = threading.Event(), threading.Event()

    def holder() -> None:
        with key_fence(git_dir, "order-1", 1.0):
            taken.set()
            release.wait(30)

    thread = threading.Thread(target=holder)
    thread.start()
    try:
        assert taken.wait(30)
        with pytest.raises(KeyFenceTimeout):
            with key_fence(git_dir, "order-1", 0.2):
                pass
        assert _held_elsewhere(git_dir, "order-1", byte_locks)
    finally:
        release.set()
        thread.join(30)
    assert not _held_elsewhere(git_dir, "order-1", byte_locks)


def test_a_killed_holder_releases_its_key(byte_locks, git_dir) -> None:
    code = (
        "import time; from pathlib import Path; from kb.git import key_fence as f\n"
        f"f.BYTE_LOCKS = {byte_locks}\n"
        f"with f.key_fence(Path({str(git_dir)!r}), 'order-2', 1.0):\n"
        "    print('in', flush=True); time.sleep(60)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "in"
        with pytest.raises(KeyFenceTimeout):
            with key_fence(git_dir, "order-2", 0.2):
                pass
    finally:
        holder.kill()
        holder.wait(30)
    with key_fence(git_dir, "order-2", 1.0):
        pass


def test_keys_wait_only_for_their_own_lock(byte_locks, git_dir) -> None:
    """Byte locks: a key never waits for another (not even one of its old stripe). Stripes: keys
    of one stripe wait for each other, and a thread holding one may take the other (no wait for
    itself)."""
    first, same_stripe = _one_stripe()
    with key_fence(git_dir, first, 1.0):
        assert _held_elsewhere(git_dir, same_stripe, byte_locks) is not byte_locks
        with key_fence(git_dir, same_stripe, 0.2):  # nested in the holding thread: never a wait
            with key_fence(git_dir, first, 0.2):  # re-entrant
                pass
    assert not _held_elsewhere(git_dir, first, byte_locks)
