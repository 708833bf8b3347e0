"""design §12: SQL lives in ``.sql`` files (schema, numbered migrations, named queries loaded by
name); Python holds no statement text of its own.

Two checks read the source. kb's: no ``execute``/``executemany``/``copy``/``stream`` call is given
a string literal (plain or f-string), the form a statement written in Python takes. kb's, the
tests' and bin's: no string constant or f-string starts with an SQL statement (a statement keyword
followed by the shape of a statement, as this project writes SQL: keywords in capitals); the tests'
and benchmarks' queries go to tests/sql/*.sql and bin/sql/*.sql (tests/support/named_queries.py).
:data:`FILES_OF_SQL_DATA` and :data:`STATEMENTS_AS_DATA` list the few literals whose SQL text is
what the test is about.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import kb

ROOT = Path(kb.__file__).parent.parent
CALLS = frozenset({"execute", "executemany", "copy", "stream"})

_IDENTIFIER = r'(?:[a-z_][a-z0-9_$]*|"[^"\n]+"|\{[^{}\n]*\})'
"""An identifier as written in this project's SQL (lower case, quoted, or a ``{placeholder}`` of
psycopg.sql or an f-string)."""
_NAME = rf"{_IDENTIFIER}(?:\.{_IDENTIFIER})*"
_OBJECT = rf"{_NAME}(?:\s+(?:AS\s+)?[a-z_]\w*)?(?=\s*(?:$|[;,()=]|[A-Z]{{2,}}\b))"
"""A table or other object, perhaps with an alias, followed by the end, punctuation or the next
capitalised keyword: ``kb.chunks c SET``, not ``without a marker``."""
_KINDS = r"(?:[A-Z]+\s+){1,4}"
"""The capitalised words naming what a DDL statement acts on: ``TABLE``, ``UNIQUE INDEX``,
``DATABASE IF EXISTS``, ``OWNED BY``."""
SQL_STATEMENT = re.compile(
    rf"""
    \A\s*(?:--[^\n]*\n\s*)*                                   # leading SQL comments
    (?:
        (?:SELECT|VALUES)\b\s*\S
      | WITH\s+(?:RECURSIVE\s+)?{_IDENTIFIER}\s*(?:\([^)]*\)\s*)?AS\b
      | EXPLAIN(?:\s*\(|\s+[A-Z]|\s*\Z)                       # also a bare prefix for concatenation
      | INSERT\s+INTO\s+{_OBJECT}
      | UPDATE\s+(?:ONLY\s+)?{_OBJECT}\s*SET\s
      | DELETE\s+FROM\s+{_OBJECT}
      | TRUNCATE\s+(?:TABLE\s+)?(?:ONLY\s+)?{_OBJECT}
      | (?:CREATE|ALTER|DROP|COMMENT\s+ON|REFRESH|GRANT|REVOKE)\s+{_KINDS}{_OBJECT}
      | ALTER\s+SYSTEM\s+(?:SET|RESET)\s
      | SET\s+(?:LOCAL\s+|SESSION\s+)?{_IDENTIFIER}\s*(?:=|TO\b)
      | (?:RESET|SHOW)\s+{_IDENTIFIER}\s*;?\s*\Z
      | LOCK\s+(?:TABLE\s+)?{_OBJECT}
      | (?:LISTEN|UNLISTEN|NOTIFY)\s+{_IDENTIFIER}
      | (?:BEGIN|COMMIT|ROLLBACK|START\s+TRANSACTION|SAVEPOINT\s+{_IDENTIFIER})(?:\s+[A-Z][A-Z ]*)?\s*;?\s*\Z
      | (?:VACUUM|ANALYZE|CLUSTER|REINDEX)\s+(?:\(|{_NAME}\s*;?\s*\Z)
      | COPY\s+(?:\(|{_OBJECT})
      | DO\s+\$
      | CALL\s+{_NAME}\s*\(
      | CHECKPOINT\s*;?\s*\Z
    )
    """,
    re.VERBOSE,
)
"""A text that starts with an SQL statement."""

FILES_OF_SQL_DATA = {
    "tests/test_migration_lint.py": "the migrations fed to bin/lint_migrations.py are the test's input",
    "tests/test_sql_lives_in_files.py": "the statements the detector is checked against",
}
"""Files whose SQL literals are all data: the check skips them."""
_PSQL_LINE = "a `kb psql -c` command line as a user types it"
STATEMENTS_AS_DATA = {
    ("tests/test_cli_errors.py", "SELECT count(*) FROM kb.schema_migrations"): _PSQL_LINE,
    ("tests/test_cli_storage_root.py", "SELECT 1"): _PSQL_LINE + " that a storage root without kb refuses",
    ("tests/test_new_user.py", "SELECT current_database()"): _PSQL_LINE + " (with -d NAME)",
    ("tests/test_new_user.py", "SELECT count(*) FROM kb.schema_migrations"): _PSQL_LINE,
    ("tests/test_roles.py", "SELECT count(*) FROM kb.job_health"): _PSQL_LINE + ", as kb_operator",
    ("tests/test_roles.py", "SELECT count(*) FROM procrastinate_jobs"): _PSQL_LINE + ", as kb_operator",
    ("tests/test_roles.py", "DELETE FROM kb.documents"): _PSQL_LINE + " that kb_operator must be refused",
}
"""Single literals, by file and exact text, whose SQL is what the test is about, not a statement
its code runs. :func:`test_the_data_exceptions_still_hold_sql` notices an entry no longer needed."""


def _literal_statements(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in CALLS
            and node.args
            and (
                isinstance(node.args[0], ast.JoinedStr)
                or (isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str | bytes))
            )
        ):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_no_statement_text_in_kbs_python():
    package = Path(kb.__file__).parent
    found = [where for path in sorted(package.rglob("*.py")) for where in _literal_statements(path)]
    assert found == [], f"SQL written in Python (move it to sql/queries/*.sql and load it by name): {found}"


def _string_text(node: ast.AST) -> str | None:
    """The text of a string constant, or of an f-string with each ``{…}`` as ``{}``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str | bytes):
        return node.value.decode("latin-1") if isinstance(node.value, bytes) else node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(part.value if isinstance(part, ast.Constant) else "{}" for part in node.values)
    return None


def sql_literals(path: Path) -> list[tuple[int, str]]:
    """``(line, text)`` of every string constant or f-string of the file that starts with an SQL
    statement (implicitly joined literals count as one, as Python joins them)."""
    tree = ast.parse(path.read_text(), str(path))
    inside_fstrings = {id(part) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for part in node.values}
    found = []
    for node in ast.walk(tree):
        text = None if id(node) in inside_fstrings else _string_text(node)
        if text is not None and SQL_STATEMENT.match(text):
            found.append((getattr(node, "lineno", 0), text))
    return sorted(found)


def _python_files() -> list[Path]:
    """The project's Python under kb/, tests/ and bin/ (not what npm installs under tests/zero)."""
    return sorted(
        p
        for folder in ("kb", "tests", "bin")
        for p in (ROOT / folder).rglob("*.py")
        if "node_modules" not in p.relative_to(ROOT).parts
    )


def test_no_sql_statement_in_python():
    found = [
        f"{name}:{line}: {text.strip().splitlines()[0][:60]}"
        for path in _python_files()
        if (name := str(path.relative_to(ROOT))) not in FILES_OF_SQL_DATA
        for line, text in sql_literals(path)
        if (name, text) not in STATEMENTS_AS_DATA
    ]
    assert found == [], (
        "SQL written in Python: move it to a named query (kb: sql/queries/*.sql; tests: tests/sql/testing.sql; "
        "bin: bin/sql/*.sql) and take it by name, or, when the SQL text is the test's data, list it in "
        "STATEMENTS_AS_DATA:\n" + "\n".join(found)
    )


def test_the_data_exceptions_still_hold_sql():
    for name in FILES_OF_SQL_DATA:
        assert sql_literals(ROOT / name), f"{name} holds no SQL literal any more: remove it from FILES_OF_SQL_DATA"
    for name, statement in STATEMENTS_AS_DATA:
        assert statement in {text for _, text in sql_literals(ROOT / name)}, (
            f"{name} no longer holds {statement!r}: remove it from STATEMENTS_AS_DATA"
        )


@pytest.mark.parametrize(
    "text",
    [
        "SELECT 1",
        "SELECT count(*) AS n FROM kb.write_intents",
        "\nSELECT 'column' AS kind FROM information_schema.columns",
        "-- a comment first\nDELETE FROM procrastinate_jobs;",
        "WITH ranked AS (SELECT 1) SELECT * FROM ranked",
        "INSERT INTO legacy.folders (workspace_id, name) VALUES (%s, %s)",
        "UPDATE kb.chunks c SET start_line = NULL",
        "UPDATE kb.span_fill_control SET paused = true",
        "DELETE FROM kb.documents WHERE path = %s",
        "TRUNCATE kb.chunks",
        "CREATE ROLE {} LOGIN SUPERUSER",
        "CREATE SUBSCRIPTION kb_test_sub CONNECTION '{}' PUBLICATION {}",
        "DROP DATABASE IF EXISTS {} WITH (FORCE)",
        "DROP OWNED BY kb_reader",
        "DROP PUBLICATION kb_publication",
        "ALTER ROLE {} SET {} = {}",
        "ALTER TABLE kb.chunks ADD COLUMN language text;",
        "ALTER SYSTEM SET port = {}",
        "SET search_path = kb, public",
        "SHOW wal_level",
        "LOCK TABLE kb.chunks IN ACCESS EXCLUSIVE MODE",
        "LISTEN kb_events",
        "BEGIN",
        "COMMIT;",
        "EXPLAIN ",
        "EXPLAIN (FORMAT JSON) ",
        "CHECKPOINT",
    ],
)
def test_the_detector_sees_statements(text: str):
    assert SQL_STATEMENT.match(text)


@pytest.mark.parametrize(
    "text",
    [
        "DELETE",  # an HTTP method
        "TABLE",
        "TRUNCATE",  # bin/lint_migrations.py's names of statement kinds
        "DROP COLUMN",
        "DROP {}",
        "CREATE EXTENSION",
        "SET STORAGE",
        "ALTER SEQUENCE … SET LOGGED",
        "ALTER COLUMN … TYPE",
        "DELETE without WHERE",
        "TRUNCATE of the derived term statistics, refilled by the same migration",
        "DROP TABLE without a marker",
        "ALTER ROLE",  # a pytest parameter naming a mechanism
        "ALTER DATABASE",
        "Select the nearest chunks",
        "SELECTED",
        "show the plan",
        "BEGIN the import when the lock is free",
    ],
)
def test_the_detector_leaves_prose_and_names(text: str):
    assert not SQL_STATEMENT.match(text)
