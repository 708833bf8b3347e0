"""design §13: `kb serve` — real HTTP requests against a real server process: health and
readiness, search, read, log, a turn committed through the API, the CLI through KB_SERVER_URL, and
SIGTERM while the in-process worker runs a job (the job finishes, nothing is lost)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support import serving
from support.commands import git, run_cli
from support.named_queries import queries
from support.network import free_port
from support.serving import turn_locks_held
from support.waiting import wait_until

from kb.db import database

pytest.importorskip("fastapi", reason="kb serve needs the serve extra (pip install -e '.[serve]')")

TESTS = Path(__file__).resolve().parent


def _call(url: str, method: str = "GET", body: dict | None = None, token: str | None = None) -> tuple[int, object]:
    """``support.serving.call`` with ``token`` as the bearer token."""
    return serving.call(url, method, body, {"Authorization": f"Bearer {token}"} if token else None)


def _ready(url: str) -> bool:
    try:
        return _call(f"{url}/ready")[0] == 200
    except OSError:
        return False


def _start(command: list[str], env: dict[str, str], log: Path) -> tuple[subprocess.Popen, str]:
    """Start a server on a free port (its output goes to ``log``: an unread pipe could fill up)."""
    port = free_port()
    slow = "slow_server.py" in command[1]
    with log.open("w") as output:
        process = subprocess.Popen(
            [*command, *([] if slow else ["--port"]), str(port), *(["3.0"] if slow else [])],
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            text=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _ready(url) or process.poll() is not None, 120, "kb serve to be ready")
    except AssertionError:
        process.kill()
        raise
    assert process.poll() is None, log.read_text()
    return process, url


def _stop(process: subprocess.Popen, log: Path) -> str:
    """SIGTERM; uvicorn shuts down gracefully, then re-raises the signal (exit status -15)."""
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=180)
    output = log.read_text()
    assert process.returncode in (0, -signal.SIGTERM), output
    assert "Application shutdown complete" in output and "Traceback" not in output, output
    return output


def _job_status(kb, task: str) -> list[str]:
    with database.connect(kb.database_url, autocommit=True) as conn:
        return [j["status"] for j in conn.execute(queries["test_jobs"]) if j["task_name"] == task]


def test_search_read_log_and_a_turn_through_http_and_the_cli(kb, kb_env, tmp_path):
    _, secret = kb.tokens().create("test-client", "write", None)

    def call(*args, **kwargs):
        return _call(*args, **kwargs, token=secret)

    process, url = _start(
        [sys.executable, "-m", "kb.adapters.cli", "serve", "--with-worker"], kb_env, tmp_path / "serve.log"
    )
    try:
        assert _call(f"{url}/health") == (200, {"status": "ok"})
        status, readiness = _call(f"{url}/ready")  # the in-process worker's state (design §7)
        assert status == 200 and readiness["status"] == "ready", readiness
        assert readiness["worker"] in ("starting", "running") and "worker_error" not in readiness, readiness
        assert "/v1/workspaces/{workspace_id}/search" in call(f"{url}/openapi.json")[1]["paths"]
        kb.create_workspace(1)
        turn = f"{url}/v1/workspaces/1/turns/agent-1"
        status, written = call(
            f"{turn}/files/documents/Plans/Refunds.md",
            "PUT",
            {"content": "# Refunds\n\nAnnual plans get a prorated zebra refund.\n"},
        )
        assert status == 200 and written["created"] is True
        view = call(f"{turn}/files/documents/Plans/Refunds.md")[1]
        assert view["lines"][2] == [3, "Annual plans get a prorated zebra refund."] and view["total_lines"] == 3
        status, committed = call(f"{turn}/commit", "POST", {"message": "refund policy"})
        assert status == 200 and committed["added"] == ["/documents/Plans/Refunds.md"]
        committer = f"test-client <kb-token-{kb.tokens().list()[0].id}>"
        assert git(kb.settings.knowledge_store / "1", "log", "--format=%cn <%ce>") == committer + "\n"
        assert kb.head(1) == committed["revision"]
        assert git(kb.settings.knowledge_store / "1", "log", "--format=%s") == "refund policy\n"
        git(kb.settings.knowledge_store / "1", "fsck", "--strict")
        # the in-process worker indexes the revision
        wait_until(
            lambda: call(f"{url}/v1/workspaces/1/search?q=zebra&k=3")[1]["index"]["hint"] is None,
            120,
            "the in-process worker to index the revision",
        )
        status, found = call(f"{url}/v1/workspaces/1/search?q=zebra%20refund&k=3")
        assert status == 200 and found["results"][0]["path"] == "/documents/Plans/Refunds.md"
        assert [3, "Annual plans get a prorated zebra refund."] in found["results"][0]["lines"]
        status, envelope = call(f"{url}/v1/workspaces/1/documents/documents/Plans/Refunds.md")
        assert status == 200 and envelope["view"] == "full" and envelope["revision"] == committed["revision"]
        assert call(f"{url}/v1/workspaces/1/log")[1][0]["message"].startswith("refund policy\n")
        # citations: a chat's search hands out [1]; the answer's citation resolves to those lines
        chat = f"{url}/v1/workspaces/1/chats/support-1"
        cited = call(f"{chat}/search?q=zebra%20refund&k=1")[1][0]
        assert cited["cite"] == "[1]" and cited["path"] == "/documents/Plans/Refunds.md"
        normalized = call(f"{chat}/normalize", "POST", {"text": "Prorated [1:L3]."})[1]
        assert normalized["text"] == "Prorated [1:L3]."
        status, resolved = call(f"{chat}/resolve?citation=%5B1%3AL3%5D&follow=true")
        assert status == 200 and resolved["lines"] == [[3, "Annual plans get a prorated zebra refund."]]
        assert resolved["follow"]["status"] == "unchanged"
        assert call(f"{chat}/resolve?citation=%5B9%5D")[0] == 404
        missing = call(f"{url}/v1/workspaces/1/documents/documents/Nope.md")
        assert missing[0] == 404 and missing[1]["error"] == "DocumentNotFound"
        # a URL leaving out documents/ is told the URL that names the document, not the path
        # (which, taken as told, gave a URL without documents/ twice: refused again)
        short = call(f"{url}/v1/workspaces/1/documents/Plans/Refunds.md")
        assert short[0] == 400 and short[1]["error"] == "InvalidPath", short
        assert "/v1/workspaces/1/documents/documents/Plans/Refunds.md" in json.dumps(short[1]), short
        assert call(f"{url}/v1/workspaces/1/blame/Plans/Refunds.md")[0] == 400
        # a window of the committed document, as a turn's read and `kb read --offset/--limit` cut it
        status, window = call(f"{url}/v1/workspaces/1/documents/documents/Plans/Refunds.md?offset=2&limit=1")
        assert status == 200 and window["view"] == "window" and window["total_lines"] == 3, window
        assert window["lines"] == [[3, "Annual plans get a prorated zebra refund."]], window
        past = call(f"{url}/v1/workspaces/1/documents/documents/Plans/Refunds.md?offset=9")
        assert past[0] == 400 and past[1]["error"] == "OffsetOutOfRange", past
        # each line's last change, as `kb blame` prints it
        blamed = call(f"{url}/v1/workspaces/1/blame/documents/Plans/Refunds.md")[1]
        assert [(line["number"], line["revision"]["id"]) for line in blamed["lines"]] == [
            (n, committed["revision"]) for n in (1, 2, 3)
        ]
        # text that is no revision id is the caller's input (400); a well-formed unknown id is 404
        malformed = call(f"{url}/v1/workspaces/1/documents/documents/Plans/Refunds.md?revision=zzz")
        assert malformed[0] == 400 and malformed[1]["error"] == "MalformedRevision", malformed
        unknown = call(f"{url}/v1/workspaces/1/documents/documents/Plans/Refunds.md?revision=abcdef12")
        assert unknown[0] == 404 and unknown[1]["error"] == "RevisionNotFound", unknown
        # the CLI's read commands ask the server when KB_SERVER_URL is set
        served = {
            **kb_env,
            "KB_SERVER_URL": url,
            "KB_TOKEN": secret,
            "KB_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none",
        }
        assert "zebra refund" in run_cli(served, "search", "zebra", "-w", "1").stdout
        assert "     3  Annual plans" in run_cli(served, "read", "/documents/Plans/Refunds.md", "-w", "1").stdout
        assert "refund policy" in run_cli(served, "log", "-w", "1").stdout
        blamed_cli = run_cli(served, "blame", "/documents/Plans/Refunds.md", "-w", "1")  # the database is unreachable
        assert blamed_cli.stdout.splitlines()[2].startswith(committed["revision"][:10]), blamed_cli
        assert "note:" not in blamed_cli.stderr, blamed_cli.stderr
        assert "index stamp: " + committed["revision"] in run_cli(served, "status", "-w", "1").stdout
        failed = run_cli(served, "read", "/documents/Nope.md", "-w", "1", check=False)
        assert failed.returncode == 1 and failed.stderr.startswith("kb: error: no document at")
    finally:
        _stop(process, tmp_path / "serve.log")
    down = run_cli({**kb_env, "KB_SERVER_URL": url}, "search", "zebra", "-w", "1", check=False)
    assert down.returncode == 1 and "did not answer" in down.stderr


def test_sigterm_while_the_in_process_worker_runs_a_job_finishes_it(kb, kb_env, tmp_path):
    process, url = _start([sys.executable, str(TESTS / "support" / "slow_server.py")], kb_env, tmp_path / "serve.log")
    try:
        kb.create_workspace(1)
        with kb.transaction(1, "three notes", "alice") as tx:
            for i in range(3):
                tx.write(f"/documents/N{i}.md", f"note {i} about zebras\n")
        wait_until(lambda: "doing" in _job_status(kb, "kb.index_changes"), 120, "the index job to start")
    finally:
        output = _stop(process, tmp_path / "serve.log")  # the embedder takes 3 s: SIGTERM lands while the job runs
    assert _job_status(kb, "kb.index_changes") == ["succeeded"], output
    row = next(w for w in kb.workspaces() if w["id"] == 1)
    assert row["last_indexed_revision"] == kb.head(1)


def test_an_api_turn_left_idle_is_released_and_its_worktree_kept_for_a_later_commit(kb, kb_env, tmp_path):
    """design §5, §16: a client that started a turn and never came back kept it open in kb serve
    for the server's life — its worktree lock and a file descriptor each (100 abandoned turns, 100
    descriptors) — and the janitor could never remove the worktree, which an open turn holds. A
    turn idle for KB_TURN_IDLE_SECONDS is now released; its worktree stays, and a later call of
    the same turn id takes it up and commits what it held."""
    kb.create_workspace(1)
    env = {**kb_env, "KB_TURN_IDLE_SECONDS": "10"}  # past the set-up under load
    process, url = _start(
        [sys.executable, "-m", "kb.adapters.cli", "serve", "--insecure-no-auth"], env, tmp_path / "serve.log"
    )
    try:
        for name in ("left-1", "left-2"):
            status, _ = _call(
                f"{url}/v1/workspaces/1/turns/{name}/files/documents/{name}.md", "PUT", {"content": f"# {name}\n"}
            )
            assert status == 200
        assert turn_locks_held(process.pid) == 2
        wait_until(lambda: turn_locks_held(process.pid) == 0, 60, "the idle turns to be released")
        assert (kb.settings.knowledge_store / "1" / ".git" / "worktrees").is_dir()
        status, committed = _call(f"{url}/v1/workspaces/1/turns/left-1/commit", "POST", {"message": "later"})
        assert status == 200 and committed["added"] == ["/documents/left-1.md"], committed
        assert kb.read(1, "/documents/left-1.md") == b"# left-1\n"
    finally:
        _stop(process, tmp_path / "serve.log")


def test_serve_on_a_port_in_use_says_so_before_announcing_itself(kb_env):
    """design §13: with the port taken, kb serve printed its "kb serve on …" banner, then uvicorn's
    own bind error, and exited 3 — and `curl /health` answered from the process that held the port,
    so the user believed their server ran. It now refuses up front, naming the port and --port."""
    import socket

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        refused = subprocess.run(
            [sys.executable, "-m", "kb.adapters.cli", "serve", "--port", str(port), "--insecure-no-auth"],
            env=kb_env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert refused.returncode != 0
    assert f"cannot listen on 127.0.0.1:{port}" in refused.stderr and "--port" in refused.stderr, refused.stderr
    assert "kb serve on" not in refused.stderr and "Traceback" not in refused.stderr, refused.stderr
