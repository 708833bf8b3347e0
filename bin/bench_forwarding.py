#!/usr/bin/env python
"""Forwarding benchmark (design §15): a search through the non-home node vs through the home node.

Two real nodes on this machine — two storage roots, two ``kb serve`` processes (the home one with
its worker), one Postgres — and a workspace imported on node ``a`` (``docs/`` of this repository,
hashing embedder so the figures measure kb, not the model). Then ``--requests`` searches per leg,
interleaved request by request (through ``a``, then through ``b``, which forwards to ``a``), with
a few queries in turn; prints the p50 and p90 of each leg in milliseconds and the ratio b/a. The
reference leg is the home node itself.

Postgres: ``KB_DATABASE_URL`` when set (a fresh database is created), else an embedded server in a
temporary directory. Example::

    python bin/bench_forwarding.py --requests 300
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from bench_store import database
from support.serving import start_serves, stop_serve

ROOT = Path(__file__).resolve().parents[1]

QUERIES = ["how do citations stay valid", "advisory lock", "turn worktree", "embedding model", "span fill"]


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=60) as response:
        return response.read()


def _percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else values[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=200, help="searches per leg")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kb-bench-forwarding-") as tmp:
        work = Path(tmp)
        url, cleanup = database(work)
        base = {k: v for k, v in os.environ.items() if not k.startswith("KB_")}
        base.update(KB_DATABASE_URL=url, KB_EMBEDDING_MODEL="hashing")
        env_a = {**base, "KB_NODE": "a", "KB_STORAGE_ROOT": str(work / "a")}
        env_b = {**base, "KB_NODE": "b", "KB_STORAGE_ROOT": str(work / "b")}
        processes = []
        try:
            (a, url_a), (b, url_b) = start_serves(
                [(env_a, work / "a.log", ("--with-worker",)), (env_b, work / "b.log", ())]
            )
            processes += [(a, work / "a.log"), (b, work / "b.log")]
            subprocess.run(
                [sys.executable, "-m", "kb.adapters.cli", "import", str(ROOT / "docs"), "--workspace", "1"],
                env=env_a,
                check=True,
                capture_output=True,
            )
            search = "/v1/workspaces/1/search?k=5&q="
            deadline = time.monotonic() + 300
            while b'"hint":null' not in _get(url_a + search + "citations").replace(b" ", b""):
                if time.monotonic() > deadline:
                    raise SystemExit("the worker did not index the workspace in 300 s")
                time.sleep(0.5)
            for leg in (url_a, url_b):  # warm both (connections, caches)
                for q in QUERIES:
                    _get(leg + search + urllib.parse.quote(q))
            times: dict[str, list[float]] = {"home": [], "forwarded": []}
            for i in range(args.requests):
                q = urllib.parse.quote(QUERIES[i % len(QUERIES)])
                for name, leg in (
                    (("home", url_a), ("forwarded", url_b))
                    if i % 2
                    else (
                        ("forwarded", url_b),
                        ("home", url_a),
                    )
                ):
                    start = time.perf_counter()
                    _get(leg + search + q)
                    times[name].append((time.perf_counter() - start) * 1000)
            home, forwarded = statistics.median(times["home"]), statistics.median(times["forwarded"])
            load = os.getloadavg()
            print(f"searches per leg: {args.requests} (interleaved); load average {load[0]:.1f} {load[1]:.1f}")
            print(f"home node a:          p50 {home:7.1f} ms  p90 {_percentile(times['home'], 90):7.1f} ms")
            print(f"through node b:       p50 {forwarded:7.1f} ms  p90 {_percentile(times['forwarded'], 90):7.1f} ms")
            print(f"ratio (b / a, p50):   {forwarded / home:.2f}   (extra {forwarded - home:.1f} ms per request)")
        finally:
            for process, log in processes:
                stop_serve(process, log)
            cleanup()


if __name__ == "__main__":
    main()
