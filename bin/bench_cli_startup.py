"""Wall time of kb's everyday CLI commands against references measured in the same run (design §13).

    python bin/bench_cli_startup.py [--rounds 7] [--documents 50]

Sets up a throw-away storage root (embedded Postgres unless ``KB_DATABASE_URL`` is set), imports
``--documents`` generated markdown files into workspace 1 and indexes them with the hashing
embedder, then times, round by round and interleaved, ``python -c pass`` (interpreter start-up),
``git log -n 20`` on the workspace repository, and ``kb read`` / ``kb log`` / ``kb status`` /
``kb search`` (hashing embedder) as subprocesses — what a user waits for — and, for read, log
and status, a ``python -c`` that imports only what the command imports from outside kb (standard
library and third-party modules, ``outside_imports``): the floor under the command. The reference
for a search is ``rg -n -i`` over the same folder of notes (``grep -rni`` where ripgrep is not
installed). Prints medians, the ratio of each kb command to ``python -c pass`` and of each search
to the reference. Goals (design §13, §14): read/log/status ≤ 0.3 s, search ≤ 0.5 s with hashing,
≤ 1.0 s with MiniLM (its ONNX export, without torch), ≤ 0.15 s through ``kb serve``.

With ``--server`` the same kb commands also run against a ``kb serve`` subprocess
(``KB_SERVER_URL``), the warm path; ``--compare TREE`` times the same commands from another
source tree (before/after a change) in the same rounds (with ``--minilm``, its cold MiniLM search
too); ``--minilm`` adds a cold search with MiniLM
through its ONNX export on onnxruntime, on workspace 2, which holds the same notes indexed with
MiniLM (a workspace's queries are embedded by the model it records, design §7; the export itself,
with torch, is made by that untimed index run, as a user's first index makes it).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOALS = {"read": 0.3, "log": 0.3, "status": 0.3, "search": 0.5, "search (minilm, cold)": 1.0, "search (server)": 0.15}
FLOORED = ("read", "log", "status")
REFERENCE = "rg over the notes"
UNTIMED_BASES = ("python -c pass", "git log -n 20", REFERENCE)


def outside_imports(command: list[str], env: dict[str, str]) -> str:
    """``import a, b, ...``: every module that ``command`` (a kb CLI run) imports from outside kb
    directly (a kb module or the command line imports it: the Python standard library and the
    third-party libraries kb chose, such as psycopg, pydantic, dulwich and click), in the
    order it first imports them, read from the run's ``python -X importtime`` report, with the
    garbage collector paused as kb.cli pauses it for quick commands. Timed as a command of its
    own, it is the floor under ``command``: what the command pays before any line of kb runs."""
    result = subprocess.run(
        [command[0], "-X", "importtime", *command[1:]], env=env, capture_output=True, text=True, check=True
    )
    rows = []
    for line in result.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line or "cumulative" in line:
            continue
        name = line.rsplit("|", 1)[1]
        rows.append(((len(name) - len(name.lstrip())) // 2, name.strip()))
    names = []
    for i, (depth, name) in enumerate(rows):  # post-order: a module's importer follows it, one level up
        parent = next((n for d, n in rows[i + 1 :] if d < depth), None)
        outside_kb = not (name == "kb" or name.startswith("kb."))
        imported_by_kb = parent is None or parent == "kb" or parent.startswith("kb.")
        if outside_kb and imported_by_kb and name != "encodings" and not name.startswith("_"):
            names.append(name)
    # with the collector paused, as kb.cli pauses it for these commands while they import
    return "import gc; gc.disable(); import " + ", ".join(dict.fromkeys(names))


def kb_cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "kb.adapters.cli", *args]


def timed(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    """``(wall seconds, CPU seconds of the child)``: wall is what the user waits for; CPU
    (user + system) shows the command's own work when a loaded machine inflates the wall time."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    # cwd: not a source tree — ``python -m`` puts the working directory first on sys.path, which
    # would shadow PYTHONPATH (and so --compare's tree) when the bench runs from a clone's root.
    result = subprocess.run(command, env=env, capture_output=True, text=True, cwd=tempfile.gettempdir())
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({result.returncode}): {result.stderr.strip()}")
    return seconds, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_ready(url: str, timeout: float = 60.0) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/ready", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"kb serve at {url} did not become ready in {timeout:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--documents", type=int, default=50)
    parser.add_argument("--server", action="store_true", help="also time the commands through kb serve")
    parser.add_argument(
        "--compare",
        type=Path,
        metavar="TREE",
        help="also time read/log/status/search from another kb source tree (e.g. a clone of "
        "an older commit) in the same rounds",
    )
    parser.add_argument(
        "--minilm",
        action="store_true",
        help="also time a cold kb search with MiniLM (its ONNX export; made by the warm-up round)",
    )
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="kb-bench-cli-"))
    # A user's Python caches bytecode (pip compiles installed packages; an editable install writes
    # __pycache__ on first run): a sandbox's PYTHONDONTWRITEBYTECODE would make every command
    # recompile kb's modules, which no user waits for. One untimed warm-up round writes the caches.
    env = {k: v for k, v in os.environ.items() if not k.startswith("KB_") and k != "PYTHONDONTWRITEBYTECODE"}
    env.update(
        KB_STORAGE_ROOT=str(root / "storage"),
        KB_EMBEDDING_MODEL="hashing",
        PYTHONPATH=f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}",
    )
    if os.environ.get("KB_DATABASE_URL"):
        env["KB_DATABASE_URL"] = os.environ["KB_DATABASE_URL"]
    server = None
    try:
        source = root / "notes"
        source.mkdir()
        for i in range(args.documents):
            body = "\n".join(f"Line {j} of note {i}: refunds, invoices and annual plans." for j in range(40))
            (source / f"Note {i}.md").write_text(f"# Note {i}\n\n{body}\n")
        subprocess.run(kb_cli("import", str(source), "-w", "1"), env=env, check=True, capture_output=True)
        subprocess.run(kb_cli("worker", "--until-idle", "-q"), env=env, check=True, capture_output=True)
        repo = next((root / "storage" / "knowledge_store").iterdir())

        legs: dict[str, tuple[list[str], dict[str, str]]] = {
            "python -c pass": ([sys.executable, "-c", "pass"], env),
            "git log -n 20": (["git", "-C", str(repo), "log", "-n", "20"], env),
            REFERENCE: (
                ["rg", "-n", "-i", "-e", "refund", "-e", "invoice", str(source)]
                if shutil.which("rg")
                else ["grep", "-rni", "-e", "refund", "-e", "invoice", str(source)],
                env,
            ),
            "read": (kb_cli("read", "/documents/Note 7.md", "-w", "1"), env),
            "log": (kb_cli("log", "-w", "1"), env),
            "status": (kb_cli("status", "-w", "1"), env),
            "search": (kb_cli("search", "refund invoice", "-w", "1"), env),
        }
        for name in FLOORED:  # what each command imports from outside kb, on its own
            legs[f"{name}: imports"] = ([sys.executable, "-c", outside_imports(legs[name][0], env)], env)
        if args.compare:
            other = {**env, "PYTHONPATH": str(args.compare.resolve())}
            for name in ("read", "log", "status", "search"):
                legs[f"{name} (compare)"] = (legs[name][0], other)
        if args.minilm:  # workspace 2 records MiniLM as its model at its first index run (design §7)
            minilm = {**env, "KB_EMBEDDING_MODEL": "minilm"}
            subprocess.run(kb_cli("import", str(source), "-w", "2"), env=minilm, check=True, capture_output=True)
            subprocess.run(kb_cli("worker", "--until-idle", "-q"), env=minilm, check=True, capture_output=True)
            legs["search (minilm, cold)"] = (kb_cli("search", "refund invoice", "-w", "2"), minilm)
            if args.compare:
                compared = {**minilm, "PYTHONPATH": str(args.compare.resolve())}
                legs["search (minilm, cold) (compare)"] = (legs["search (minilm, cold)"][0], compared)
        if args.server:
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            server = subprocess.Popen(
                kb_cli("serve", "--port", str(port), "--insecure-no-auth"),
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            wait_ready(url)
            served = {**env, "KB_SERVER_URL": url}
            for name in ("read", "log", "status", "search"):
                legs[f"{name} (server)"] = (legs[name][0], served)
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in legs}
        for command, leg_env in legs.values():  # warm-up: bytecode caches, OS page cache
            timed(command, leg_env)
        for _ in range(args.rounds):
            for name, (command, leg_env) in legs.items():
                times[name].append(timed(command, leg_env))
        base = statistics.median(wall for wall, _ in times["python -c pass"])
        reference = statistics.median(wall for wall, _ in times[REFERENCE])
        load = os.getloadavg()[0]
        print(
            f"{args.rounds} rounds, {args.documents} documents, load average {load:.1f} on "
            f"{os.cpu_count()} CPUs; medians (interleaved round by round):"
        )
        for name, samples in times.items():
            median = statistics.median(wall for wall, _ in samples)
            cpu = statistics.median(c for _, c in samples)
            leg = name.removesuffix(" (compare)")
            goal = None if name in UNTIMED_BASES else GOALS.get(leg, GOALS.get(leg.split(" ")[0]))
            verdict = "" if goal is None else f"  goal ≤ {goal:.2f} s: {'met' if median <= goal else 'MISSED'}"
            versus = f", {median / reference:5.1f}× rg" if name.startswith("search") else ""
            print(
                f"  {name:<22} wall {median * 1000:7.0f} ms ({median / base:5.1f}× python -c pass{versus}), "
                f"CPU {cpu * 1000:6.0f} ms{verdict}"
            )
        for name in FLOORED:
            floor = statistics.median(wall for wall, _ in times[f"{name}: imports"])
            own = statistics.median(wall for wall, _ in times[name]) - floor
            print(
                f"  {name}: its imports from outside kb alone take {floor * 1000:.0f} ms; kb's own "
                f"modules and work {own * 1000:.0f} ms"
            )
    finally:
        if server is not None:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=30)
        if not os.environ.get("KB_DATABASE_URL"):
            subprocess.run(kb_cli("db-stop"), env=env, capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
