"""Named queries for the test suite and the benchmarks: kb's own plus those that do not ship.

Queries only tests run live in ``tests/sql/*.sql``, queries of the benchmarks and the search
evaluation in ``bin/sql/*.sql`` (some tests check those too); both use kb's ``-- name:`` format and
are parsed by :func:`kb.db.sql.parse_named_queries`. :data:`queries` here reads those and every
query kb ships (``kb.db.sql.queries``), so a test helper can take either kind by name. A name
defined twice, in these files or beside one of kb's, is an error. Used as
``from support.named_queries import queries``.
"""

from __future__ import annotations

import functools
from pathlib import Path

from kb.db.sql import load_queries, parse_named_queries
from kb.errors import ConfigurationError

ROOT = Path(__file__).resolve().parents[2]
UNSHIPPED_DIRS = (ROOT / "tests" / "sql", ROOT / "bin" / "sql")
"""Folders of named queries that stay out of the wheel."""


@functools.cache
def load_unshipped_queries() -> dict[str, str]:
    """``{name: sql}`` of tests/sql/*.sql and bin/sql/*.sql; raises ConfigurationError for a name
    defined twice among them or already defined by kb's sql/queries."""
    shipped = load_queries()
    found: dict[str, str] = {}
    for folder in UNSHIPPED_DIRS:
        for path in sorted(folder.glob("*.sql")):
            for name, body in parse_named_queries(path.read_text()).items():
                if name in found or name in shipped:
                    raise ConfigurationError(f"query {name!r} in {path} is defined twice")
                found[name] = body
    return found


class _Queries:
    def __getitem__(self, name: str) -> str:
        for defined in (load_unshipped_queries(), load_queries()):
            if name in defined:
                return defined[name]
        raise ConfigurationError(f"no named query {name!r} in sql/queries, tests/sql or bin/sql")


queries = _Queries()
"""``queries["name"]`` → the SQL text of a named query of kb, tests/sql or bin/sql."""
