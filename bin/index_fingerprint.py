#!/usr/bin/env python
"""What an index run stored, as one md5 per table (design §7, §14): the proof that a faster index
pipeline stores exactly what the slower one did.

Rows are keyed by document path, never by ids or workspace number (query ``bench_index_fingerprint``
in bin/sql/bench.sql): documents (status, stamps as revision sequence numbers), chunks (text, spans,
vector, tsvector, token counts), document terms, the four term statistics tables, the cached vectors
of the workspace's chunks and the workspace's own stamp. Two databases that indexed the same corpus
(say this tree's and main's, ``bin/bench_index_pipeline.py --compare TREE --fingerprint``) agree
exactly when every part does.

Usage: python bin/index_fingerprint.py URL WORKSPACE [URL2 WORKSPACE2]
       (with two, prints both and exits 1 when any part differs)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kb.db import database  # noqa: E402
from tests.support.named_queries import queries  # noqa: E402


def fingerprint(url: str, workspace_id: int) -> dict[str, tuple[int, str | None]]:
    """``{part: (rows, md5)}`` of ``workspace_id``'s index in the database at ``url``."""
    with database.connect(url, autocommit=True) as conn:
        rows = conn.execute(queries["bench_index_fingerprint"], {"workspace_id": workspace_id}).fetchall()
    return {row["part"]: (row["rows"], row["md5"]) for row in rows}


def differences(ours: dict[str, tuple[int, str | None]], theirs: dict[str, tuple[int, str | None]]) -> list[str]:
    """The parts of two fingerprints that differ (empty: the two indexes are equal)."""
    return [part for part in sorted(ours.keys() | theirs.keys()) if ours.get(part) != theirs.get(part)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("workspace", type=int)
    parser.add_argument("other_url", nargs="?")
    parser.add_argument("other_workspace", type=int, nargs="?")
    args = parser.parse_args()
    ours = fingerprint(args.url, args.workspace)
    if args.other_url is None:
        for part, (rows, md5) in sorted(ours.items()):
            print(f"{part:24s} {rows:7d} {md5}")
        return
    theirs = fingerprint(args.other_url, args.other_workspace or args.workspace)
    for part in sorted(ours.keys() | theirs.keys()):
        (rows, md5), (other_rows, other_md5) = ours.get(part, (0, None)), theirs.get(part, (0, None))
        print(f"{part:24s} {rows:7d} {md5}  {other_rows:7d} {other_md5}  {'same' if md5 == other_md5 else 'DIFFERENT'}")
    sys.exit(1 if differences(ours, theirs) else 0)


if __name__ == "__main__":
    main()
