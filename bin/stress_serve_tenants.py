#!/usr/bin/env python
"""Tenants side by side on one real ``kb serve`` (design §5, §16): N tenants (a workspace and a
write token each), T client threads each, turn after turn (write, read back, edit, remove, keyed
commit) while a slow writer now and then holds one tenant's write lock. Every answer is checked
(tests/support/tenant_stress.py); CI runs a short sample (tests/test_serve_tenants_stress.py).

Usage: python bin/stress_serve_tenants.py [--tenants 6] [--threads 3] [--seconds 30] [--hold 0.5]
A fresh storage root and embedded Postgres in a temporary folder (or KB_DATABASE_URL's server).
Prints the faults, the totals and each call's median and 95th-percentile latency; exit status 1
on any fault.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from kb.knowledge_base import KnowledgeBase  # noqa: E402
from kb.settings import Settings  # noqa: E402
from tests.support.serving import start_serve, stop_serve  # noqa: E402
from tests.support.tenant_stress import stress_tenants  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tenants", type=int, default=6)
    parser.add_argument("--threads", type=int, default=3, help="client threads per tenant")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--hold", type=float, default=0.5, help="seconds the slow writer holds a lock (0: none)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kb-tenants-") as root:
        settings = Settings(storage_root=Path(root), embedding_model="hashing")
        kb = KnowledgeBase.open(settings)
        try:
            tenants = []
            first = max((w["id"] for w in kb.workspaces()), default=0) + 1
            for ws in range(first, first + args.tenants):
                kb.create_workspace(ws)
                tenants.append((ws, kb.tokens().create(f"tenant-{ws}", "write", [ws])[1]))
            env = {k: v for k, v in os.environ.items() if not k.startswith("KB_")}
            env.update(KB_DATABASE_URL=kb.database_url, KB_STORAGE_ROOT=root, KB_EMBEDDING_MODEL="hashing")
            log = Path(root) / "serve.log"
            process, url = start_serve(env, log)
            try:
                report = stress_tenants(kb, url, tenants, args.seconds, args.threads, hold_seconds=args.hold)
            finally:
                output = stop_serve(process, log)
        finally:
            kb.close()
            if not settings.database_url:
                from kb.db.database import stop_embedded

                stop_embedded(Path(root) / "postgres")
    for line in report.faults:
        print(line)
    if "Traceback" in output:
        print("the server logged a traceback:\n" + output[-3000:])
    print("totals: " + ", ".join(f"{n} {k}" for k, n in sorted(report.counts.items())))
    for call, seconds in sorted(report.latencies.items()):
        ordered = sorted(seconds)
        p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
        print(
            f"{call:7s} {len(ordered):6d} calls  median {statistics.median(ordered) * 1000:7.1f} ms  p95 {p95 * 1000:7.1f} ms"
        )
    return 1 if report.faults or "Traceback" in output else 0


if __name__ == "__main__":
    sys.exit(main())
