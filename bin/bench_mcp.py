#!/usr/bin/env python
"""Benchmark an MCP tool call round trip over stdio against the same call on the facade (design §5).

One process holds both legs. The MCP leg is the SDK's own client talking to a real ``kb mcp``
subprocess over stdin/stdout (JSON-RPC framing, pydantic validation, the tool's thread hop, the
conversation's registry writes); the reference leg is the direct facade call that the tool wraps,
in this process, with its connection and rendering. Legs interleave round by round; medians are
compared. Two operations are timed: ``read`` (a windowed, cited read of one document) and ``search``
(hashing embedder, so the query embedding is not what is measured). Prints figures; asserts nothing.

Usage: python bin/bench_mcp.py [--root /tmp/kb-bench-mcp] [--rounds 50]
The workspace is this repository's own docs/ imported into workspace 1 of an embedded database under
``--root`` (or ``KB_DATABASE_URL``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mcp import Client
from mcp.client.stdio import StdioServerParameters

from kb.knowledge_base import KnowledgeBase
from kb.settings import Settings

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path("/tmp/kb-bench-mcp"))
    parser.add_argument("--rounds", type=int, default=50)
    args = parser.parse_args()
    os.environ["KB_STORAGE_ROOT"] = str(args.root)
    os.environ["KB_EMBEDDING_MODEL"] = "hashing"
    settings = Settings()
    kb = KnowledgeBase.open(settings)
    if not kb.store(1).exists():
        kb.import_folder(REPO / "docs", 1)
    kb.index(1)
    path = sorted(kb.list_paths(1))[0]
    conv = kb.conversation(1, "bench-direct")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    server = StdioServerParameters(
        command=sys.executable, args=["-m", "kb.adapters.cli", "mcp", "--workspace", "1"], env=env, cwd=str(REPO)
    )
    timings: dict[str, list[float]] = {"mcp read": [], "facade read": [], "mcp search": [], "facade search": []}

    async def run() -> None:
        async with Client(server) as client:
            await client.call_tool("read", {"path": path, "limit": 20})  # warm both sides once
            conv.read(path, limit=20)
            for _ in range(args.rounds):
                start = time.perf_counter()
                await client.call_tool("read", {"path": path, "limit": 20})
                timings["mcp read"].append(time.perf_counter() - start)
                start = time.perf_counter()
                conv.read(path, limit=20).render()
                timings["facade read"].append(time.perf_counter() - start)
                start = time.perf_counter()
                await client.call_tool("search", {"query": "how do citations stay valid", "k": 5})
                timings["mcp search"].append(time.perf_counter() - start)
                start = time.perf_counter()
                "\n".join(e.render() for e in conv.search("how do citations stay valid", k=5))
                timings["facade search"].append(time.perf_counter() - start)

    anyio.run(run)
    kb.close()
    medians = {name: statistics.median(values) * 1000 for name, values in timings.items()}
    for name, value in medians.items():
        print(f"{name:>14}: median {value:7.2f} ms over {args.rounds} rounds")
    for op in ("read", "search"):
        print(
            f"{op}: MCP over stdio / facade = {medians['mcp ' + op] / medians['facade ' + op]:.2f}x "
            f"(+{medians['mcp ' + op] - medians['facade ' + op]:.2f} ms per call)"
        )


if __name__ == "__main__":
    main()
