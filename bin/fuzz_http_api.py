"""A long fuzz of kb serve's HTTP API from its OpenAPI document (design §16):

    python bin/fuzz_http_api.py --requests 3000 [--seed 1]

Starts a real ``kb serve`` (hashing embedder) on loopback over ``KB_DATABASE_URL`` when set, else
an embedded Postgres under a temporary storage root (removed afterwards), and sends schemathesis'
requests with no token, a malformed one, a read token and a write token
(``tests/support/api_fuzz.py``). Prints the statuses, the 5xx responses and the writes made
without a write token (both must be 0); exits 1 when either is not. The CI runs a sample
(tests/test_access.py).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx

from tests.support import api_fuzz
from tests.support.network import free_port


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    from kb.knowledge_base import KnowledgeBase
    from kb.settings import Settings

    with tempfile.TemporaryDirectory(prefix="kb-fuzz-http-") as root:
        settings = Settings(storage_root=Path(root), embedding_model="hashing")
        kb = KnowledgeBase.open(settings)
        tokens, writer_id, heads = api_fuzz.prepare(kb)
        port = free_port()
        env = {
            **os.environ,
            "KB_STORAGE_ROOT": root,
            "KB_EMBEDDING_MODEL": "hashing",
            "KB_DATABASE_URL": kb.database_url,
        }
        log = Path(root) / "serve.log"
        with log.open("w") as output:
            server = subprocess.Popen(
                [sys.executable, "-m", "kb.adapters.cli", "serve", "--port", str(port)],
                env=env,
                stdout=output,
                stderr=subprocess.STDOUT,
            )
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                try:
                    if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.3)
            report = api_fuzz.run(url, tokens, args.requests, args.seed)
            api_fuzz.check_history(kb, writer_id, heads, report)
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=120)
            tracebacks = log.read_text().count("Traceback")
            kb.close()
            if not os.environ.get("KB_DATABASE_URL"):
                from kb.db.embedded_server import stop_embedded

                stop_embedded(Path(root) / "postgres")
    print(report.summary())
    print(f"server tracebacks logged: {tracebacks}")
    for line in (report.server_errors + report.unauthorized_writes)[:20]:
        print("  FAIL", line)
    return 1 if report.server_errors or report.unauthorized_writes else 0


if __name__ == "__main__":
    sys.exit(main())
