#!/usr/bin/env python
"""design §15 benchmark and kill matrix: move a large workspace between two real nodes.

    python bin/move_workspace.py CORPUS/tldr/pages [--rounds 3] [--kills]

Two `kb serve` nodes (a and b: two storage roots, two ports, one embedded Postgres in a temporary
folder, no worker so the move is timed alone) and workspace 1 imported on a from SOURCE. Then:

* **move time**, legs interleaved: the reference (the raw git work a move needs: ``git bundle
  create --all`` of the home's repository and ``git clone`` of that bundle into a fresh folder,
  checkout included) and kb (``kb workspace move 1 --to <the other node>``, the CLI's wall time),
  ``--rounds`` times each (the workspace goes back and forth); prints medians and kb/reference.
* **kill matrix** (``--kills``): for each step of a move (``kb.faults.MOVE_POINTS``) the move is
  SIGKILLed there, then a write is tried (refused while the window is open), the move is either
  resumed (run again) or aborted, alternately, and a write must land again; at the end every
  write reported landed is in the history, the home's repository passes ``git fsck`` and its HEAD
  is the recorded head.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from support.commands import git, run_cli  # noqa: E402
from support.kb_nodes import Node as KbNode  # noqa: E402
from support.kb_nodes import admin_token, start, stop  # noqa: E402
from support.kb_nodes import node as new_node  # noqa: E402

from kb.db.database import start_embedded, stop_embedded  # noqa: E402
from kb.faults import MOVE_POINTS  # noqa: E402
from kb.knowledge_base import KnowledgeBase  # noqa: E402
from kb.settings import Settings  # noqa: E402

AUTH: dict[str, str] = {}  # the nodes' admin token header (design §16), set once it exists


def call(url: str, method: str = "GET", body: dict | None = None) -> tuple[int, dict]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data, {"Content-Type": "application/json", **AUTH}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def write(url: str, n: int) -> tuple[str, str | None]:
    """One write through a node's port: ``(outcome, revision)``, outcome ``landed``, ``refused``
    (WorkspaceMoving) or the error's name."""
    turn = f"{url}/v1/workspaces/1/turns/k{n}"
    status, answer = call(f"{turn}/files/documents/kills/{n}.md", "PUT", {"content": f"kill {n}\n"})
    if status == 200:
        status, answer = call(f"{turn}/commit", "POST", {"message": f"kill {n}"})
    if status == 200:
        return "landed", answer["revision"]
    call(turn, "DELETE")
    return ("refused" if answer.get("error") == "WorkspaceMoving" else str(answer.get("error"))), None


def home_of(settings: Settings) -> str:
    from kb.db.nodes import workspace_home

    home = workspace_home(settings.database_url, 1)
    assert home is not None
    return home.node


def reference(repo: Path, scratch: Path) -> float:
    """The raw git work of a copy: bundle the repository, clone the bundle (with checkout)."""
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    started = time.perf_counter()
    git(repo, "bundle", "create", "--quiet", str(scratch / "r.bundle"), "--all")
    subprocess.run(["git", "clone", "--quiet", str(scratch / "r.bundle"), str(scratch / "clone")], check=True)
    seconds = time.perf_counter() - started
    shutil.rmtree(scratch, ignore_errors=True)
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kills", action="store_true", help="also run the kill matrix")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="kb-move-"))
    nodes: list[KbNode] = []
    try:
        url = start_embedded(folder / "postgres")
        nodes.extend(new_node(url, name, folder / name) for name in ("a", "b"))
        a, b = nodes
        token = admin_token(a.env)
        for node in nodes:
            node.env["KB_TOKEN"] = token
        AUTH["Authorization"] = f"Bearer {token}"
        by_name = {n.name: n for n in nodes}
        started = time.perf_counter()
        run_cli(a.env, "import", str(args.source), "--workspace", "1")
        import_seconds = time.perf_counter() - started
        for node in nodes:
            start(node, worker=False)
        settings = Settings(database_url=url, storage_root=folder / "probe", embedding_model="hashing", node="probe")
        documents = sum(1 for p in args.source.rglob("*.md") if p.is_file())
        size = sum(f.stat().st_size for f in (a.root / "knowledge_store" / "1" / ".git").rglob("*") if f.is_file())
        kb_legs, ref_legs = [], []
        for _ in range(args.rounds):
            home = by_name[home_of(settings)]
            other = b if home is a else a
            ref_legs.append(reference(home.root / "knowledge_store" / "1", folder / "scratch"))
            started = time.perf_counter()
            moved = run_cli(home.env, "workspace", "move", "1", "--to", other.name)
            kb_legs.append(time.perf_counter() - started)
            print(moved.stdout, end="", flush=True)
            print(f"move {home.name} -> {other.name}: {kb_legs[-1]:.2f} s (reference {ref_legs[-1]:.2f} s)", flush=True)
        result: dict[str, object] = {
            "documents": documents,
            "repository_bytes": size,
            "import_seconds": round(import_seconds, 2),
            "rounds": args.rounds,
            "kb_move_seconds_median": round(statistics.median(kb_legs), 2),
            "reference_seconds_median": round(statistics.median(ref_legs), 2),
            "kb_over_reference": round(statistics.median(kb_legs) / statistics.median(ref_legs), 2),
        }
        if args.kills:
            result["kills"] = kill_matrix(settings, by_name)
        print(json.dumps(result, indent=2))
        return 0
    finally:
        for node in nodes:
            stop(node)
        stop_embedded(folder / "postgres")
        shutil.rmtree(folder, ignore_errors=True)


def history(settings: Settings, home: KbNode, limit: int) -> list:
    """The workspace's recorded history, read through its home node's storage."""
    with KnowledgeBase.open(settings.model_copy(update={"storage_root": home.root, "node": home.name})) as kb:
        return kb.history(1, limit=limit)


def kill_matrix(settings: Settings, by_name: dict[str, KbNode]) -> list[dict]:
    """Kill a move at each step; resume or abort; check that nothing was lost (see the docstring)."""
    rows, landed, n = [], {}, 0
    for i, point in enumerate(MOVE_POINTS * 2):
        resolution = "resume" if i % 2 == 0 else "abort"
        home = by_name[home_of(settings)]
        other = next(node for node in by_name.values() if node is not home)
        killed = run_cli(
            {**home.env, "KB_FAULT_POINT": point}, "workspace", "move", "1", "--to", other.name, check=False
        )
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        n += 1
        during, revision = write(home.url, n)
        if revision:
            landed[f"/documents/kills/{n}.md"] = revision
        started = time.perf_counter()
        if resolution == "resume":
            run_cli(home.env, "workspace", "move", "1", "--to", other.name)
        else:
            run_cli(home.env, "workspace", "move", "1", "--abort")
        seconds = time.perf_counter() - started
        n += 1
        after, revision = write(home.url, n)  # through the old home's port: forwarded when it moved
        if revision:
            landed[f"/documents/kills/{n}.md"] = revision
        now = by_name[home_of(settings)]
        repo = now.root / "knowledge_store" / "1"
        fsck = subprocess.run(["git", "-C", str(repo), "fsck", "--strict", "--no-dangling"], capture_output=True)
        rows.append(
            {
                "killed_at": point,
                "then": resolution,
                "write_after_kill": during,
                "write_after_resolution": after,
                "home": now.name,
                "seconds": round(seconds, 2),
                "git_fsck_ok": fsck.returncode == 0,
                "head_is_recorded": git(repo, "rev-parse", "HEAD").strip() == history(settings, now, 1)[0].id,
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    recorded = {c.path for r in history(settings, by_name[home_of(settings)], 100_000) for c in r.changes}
    lost = sorted(set(landed) - recorded)
    rows.append({"landed": len(landed), "lost": lost})
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
