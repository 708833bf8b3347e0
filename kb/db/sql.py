"""Loading SQL from ``.sql`` files: the schema, the numbered migrations and named queries (design §12).

Named queries live in ``sql/queries/<concept>.sql`` as blocks introduced by ``-- name: <query>``
(the procrastinate convention); Python code refers to them as ``queries["<query>"]``. Nothing else
in kb holds SQL text. A name is a :data:`~kb.db.query_names.QueryName` (a Literal generated from the
files by bin/write_query_names.py), so the type checker rejects a name no file defines. Queries only
the tests or the benchmarks run live in tests/sql and bin/sql and do not ship (tests/named_queries.py).
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import TYPE_CHECKING

from kb.db.query_names import QueryName
from kb.errors import ConfigurationError
from kb.extras import reinstall_command

if TYPE_CHECKING:
    from psycopg import sql

# The kb package folder (this module lives in kb/db/).
_PACKAGE = Path(__file__).resolve().parent.parent
_NAME = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)


def sql_root() -> Path:
    """Directory holding ``schema.sql``, ``queries/`` and ``migrations/``.

    In a wheel the files are installed inside the package (``kb/_sql``); in a source checkout they
    are the top-level ``sql/`` and ``migrations/`` folders. Raises ConfigurationError if neither exists.
    """
    packaged = _PACKAGE / "_sql"
    if (packaged / "schema.sql").exists():
        return packaged
    checkout = _PACKAGE.parent / "sql"
    if (checkout / "schema.sql").exists():
        return checkout
    raise ConfigurationError(f"kb's SQL files are missing; reinstall kb ({reinstall_command()})")


def migrations_dir() -> Path:
    """Directory of the numbered migration files ``NNNN_verb_object.sql``."""
    packaged = _PACKAGE / "_migrations"
    if packaged.is_dir():
        return packaged
    return _PACKAGE.parent / "migrations"


def parse_named_queries(text: str) -> dict[str, str]:
    """Split a ``.sql`` file into ``{name: sql}`` by its ``-- name:`` markers."""
    queries: dict[str, str] = {}
    matches = list(_NAME.finditer(text))
    for match, following in zip(matches, matches[1:] + [None]):
        end = following.start() if following else len(text)
        body = text[match.end() : end].strip()
        queries[match.group(1)] = body
    return queries


@functools.cache
def load_queries() -> dict[str, str]:
    """All named queries of ``sql/queries/*.sql``; duplicate names are a ConfigurationError."""
    queries: dict[str, str] = {}
    for path in sorted((sql_root() / "queries").glob("*.sql")):
        for name, body in parse_named_queries(path.read_text()).items():
            if name in queries:
                raise ConfigurationError(f"query {name!r} is defined twice ({path.name})")
            queries[name] = body
    return queries


class _Queries:
    def __getitem__(self, name: QueryName) -> str:
        try:
            return load_queries()[name]
        except KeyError:
            raise ConfigurationError(f"no named query {name!r} in sql/queries") from None


queries = _Queries()
"""``queries["name"]`` → the SQL text of a named query."""


@functools.cache
def composable(name: QueryName) -> sql.SQL:
    """The named query as a psycopg ``sql.SQL`` without its final semicolon, to be nested in
    another statement or have its ``{placeholders}`` filled by ``.format`` (e.g. the legs of
    ``search_candidates``). Raises ConfigurationError for an unknown name."""
    from psycopg import sql

    return sql.SQL(queries[name].rstrip().rstrip(";"))
