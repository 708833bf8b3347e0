#!/usr/bin/env python
"""Benchmark what a token check adds to a request of ``kb serve`` (design §16; the bar: ≤ 1 ms).

Two real ``kb serve`` processes over the same database and storage root: one requiring tokens
(every request verified in Postgres: one index lookup on the SHA-256, no cache) and one started
with ``--insecure-no-auth``. The same search (hashing embedder, this repository's docs/ in
workspace 1) goes to each over a kept-alive HTTP connection, legs interleaved round by round;
prints the p50 and p90 of each leg, their difference, the in-process cost of
``TokenStore.verify`` alone and, as its floor, one bare round trip to Postgres. Asserts nothing.

Usage: python bin/bench_auth.py [--rounds 300] [--root /tmp/kb-bench-auth]
Uses ``KB_DATABASE_URL`` when set, else an embedded Postgres under ``--root``.
"""

from __future__ import annotations

import argparse
import http.client
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kb.db import database
from kb.knowledge_base import KnowledgeBase
from kb.settings import Settings
from tests.support.named_queries import queries
from tests.support.network import free_port

REPO = Path(__file__).resolve().parents[1]
QUERY = "/v1/workspaces/1/search?q=how%20do%20citations%20stay%20valid&k=5"


def start(env: dict[str, str], *extra: str) -> tuple[subprocess.Popen, int]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "kb.adapters.cli", "serve", "--port", str(port), *extra],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/ready")
            if conn.getresponse().status == 200:
                return process, port
        except OSError:
            time.sleep(0.3)
    process.kill()
    raise SystemExit("kb serve did not become ready")


def timed(conn: http.client.HTTPConnection, headers: dict[str, str]) -> float:
    started = time.perf_counter()
    conn.request("GET", QUERY, headers=headers)
    response = conn.getresponse()
    response.read()
    elapsed = time.perf_counter() - started
    assert response.status == 200, response.status
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--root", type=Path, default=Path("/tmp/kb-bench-auth"))
    args = parser.parse_args()
    shutil.rmtree(args.root, ignore_errors=True)
    settings = Settings(storage_root=args.root, embedding_model="hashing")
    kb = KnowledgeBase.open(settings)
    kb.create_workspace(1)
    kb.import_folder(REPO / "docs", 1)
    kb.run_worker(until_idle=True)
    store = kb.tokens()
    _, secret = store.create("bench", "read", [1])
    env = {
        **os.environ,
        "KB_STORAGE_ROOT": str(args.root),
        "KB_EMBEDDING_MODEL": "hashing",
        "KB_DATABASE_URL": kb.database_url,
    }
    servers = [start(env), start(env, "--insecure-no-auth")]
    try:
        legs = {
            "with auth": (
                http.client.HTTPConnection("127.0.0.1", servers[0][1]),
                {"Authorization": f"Bearer {secret}"},
            ),
            "without auth": (http.client.HTTPConnection("127.0.0.1", servers[1][1]), {}),
        }
        times: dict[str, list[float]] = {name: [] for name in legs}
        verify: list[float] = []
        floor: list[float] = []
        for round_ in range(args.rounds + 20):
            for name, (conn, headers) in legs.items():
                elapsed = timed(conn, headers)
                if round_ >= 20:  # warm-up: pools, caches
                    times[name].append(elapsed)
            started = time.perf_counter()
            store.verify(secret)
            middle = time.perf_counter()
            with database.pooled_connection(kb.database_url, autocommit=True) as conn:
                conn.execute(queries["bench_round_trip"]).fetchone()
            if round_ >= 20:
                verify.append(middle - started)
                floor.append(time.perf_counter() - middle)
        # the check alone, back to back (no HTTP between: what it costs while the CPU is free)
        tight: dict[str, list[float]] = {"verify": [], "round trip": []}
        for _ in range(1000):
            started = time.perf_counter()
            store.verify(secret)
            middle = time.perf_counter()
            with database.pooled_connection(kb.database_url, autocommit=True) as conn:
                conn.execute(queries["bench_round_trip"]).fetchone()
            tight["verify"].append(middle - started)
            tight["round trip"].append(time.perf_counter() - middle)
    finally:
        for process, _ in servers:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=120)
        kb.close()
    load = os.getloadavg()[0]
    print(f"search over HTTP, {args.rounds} rounds, legs interleaved; load average {load:.1f}")
    p50 = {}
    for name, values in times.items():
        p50[name] = statistics.median(values) * 1000
        p90 = statistics.quantiles(values, n=10)[-1] * 1000
        print(f"  {name:<13} p50 {p50[name]:7.2f} ms   p90 {p90:7.2f} ms")
    delta = p50["with auth"] - p50["without auth"]
    print(f"  token check adds {delta:+.2f} ms at p50 (ratio {p50['with auth'] / p50['without auth']:.3f})")
    print(
        f"  TokenStore.verify alone (in process): p50 {statistics.median(verify) * 1000:.2f} ms; "
        f"a bare round trip (SELECT 1, same pool): p50 {statistics.median(floor) * 1000:.2f} ms"
    )
    print(
        f"  back to back, 1000 each: verify p50 {statistics.median(tight['verify']) * 1000:.3f} ms, "
        f"bare round trip p50 {statistics.median(tight['round trip']) * 1000:.3f} ms"
    )


if __name__ == "__main__":
    main()
