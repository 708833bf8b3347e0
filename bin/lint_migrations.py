"""Lint the numbered migrations in migrations/ (design §12: schema changes are append-only files).

Checks, each a line of output naming the file and what to do:

* names: ``NNNN_verb_object.sql`` (four digits, lower-case words joined by ``_``, the first word a
  verb of :data:`VERBS`); files recorded before this lint existed keep their names.
* numbers: unique and increasing; the gaps already recorded (0002, 0004, 0009) stay, a new file
  takes the next number after the last recorded one.
* append-only: ``migrations/CHECKSUMS`` lists the sha256 of every recorded file (``sha256sum``
  format, so ``cd migrations && sha256sum -c CHECKSUMS`` checks it too). A recorded file that is
  edited or removed fails; a new file fails until ``python bin/lint_migrations.py --record``
  appends its line, which it does only when the new file passes every other check (it never
  rewrites a recorded line).
* parsing: every statement parses with sqlglot's postgres dialect. What sqlglot cannot parse it
  keeps as an opaque ``Command``; that is accepted only for the forms in :data:`UNPARSED_ALLOWED`
  (extensions, plpgsql functions and DO blocks, text search configurations, sequence and storage
  settings), and their text is still searched for destructive keywords.
* destructive statements: DROP TABLE/SCHEMA, ALTER TABLE … DROP COLUMN, ALTER COLUMN … TYPE,
  TRUNCATE and DELETE without WHERE need a comment ``-- kb:destructive <reason>`` right before the
  statement. The ones recorded before the marker existed are in :data:`DESTRUCTIVE_BEFORE_MARKER`.

* long locks: a statement that holds a lock blocking writes to a table the migration did not create
  for as long as the table is big — ``CREATE INDEX`` (migrations run in one transaction, so not
  ``CONCURRENTLY``, which this lint refuses outright), ``ADD COLUMN`` with ``NOT NULL`` and no
  default, with a volatile default or ``GENERATED`` (a rewrite), ``ALTER COLUMN … SET NOT NULL`` (a scan),
  ``ADD CONSTRAINT`` of a check or foreign key without ``NOT VALID`` (a scan) or of a unique or
  primary key (an index build), ``UPDATE`` without ``WHERE`` (every row locked until the
  migration commits), ``VACUUM FULL`` and ``CLUSTER`` (rewrites) — needs a comment
  ``-- kb:locks <reason>`` right before it (why the table is small or the pause acceptable; the
  operator upgrades at a quiet moment, docs/operations.md). The recorded ones are in
  :data:`LOCKING_BEFORE_MARKER`.

Exit status 0 when clean, 1 with findings. ``--dir`` lints another folder (the tests use it).
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import sqlglot
from sqlglot import exp

ROOT = Path(__file__).resolve().parents[1]
MIGRATIONS = ROOT / "migrations"
CHECKSUMS = "CHECKSUMS"
NAME = re.compile(r"^(\d{4})_([a-z0-9]+(?:_[a-z0-9]+)+)\.sql$")
VERBS = frozenset(
    {
        "add",
        "allow",
        "alter",
        "backfill",
        "change",
        "create",
        "drop",
        "enable",
        "disable",
        "extend",
        "index",
        "make",
        "merge",
        "move",
        "record",
        "remove",
        "rename",
        "replace",
        "split",
        "store",
    }
)
"""First word of a new migration's name: what it does to the object that follows."""
MARKER = re.compile(r"kb:destructive\s+\S")
UNPARSED_ALLOWED = [
    (re.compile(r"^CREATE\s+EXTENSION\b", re.I), "CREATE EXTENSION"),
    (re.compile(r"^CREATE\s+(OR\s+REPLACE\s+)?FUNCTION\b", re.I), "a function with a plpgsql/sql body"),
    (re.compile(r"^DO\s+\$", re.I), "a DO block"),
    (re.compile(r"^(CREATE|ALTER)\s+TEXT\s+SEARCH\b", re.I), "a text search configuration"),
    (re.compile(r"^ALTER\s+SEQUENCE\s+\S+\s+SET\s+(UN)?LOGGED\b", re.I), "ALTER SEQUENCE … SET LOGGED"),
    (re.compile(r"^ALTER\s+TABLE\s+\S+\s+ALTER\s+COLUMN\s+\S+\s+SET\s+STORAGE\b", re.I), "SET STORAGE"),
]
"""Statement forms sqlglot keeps as an opaque Command that a migration may still use."""
DESTRUCTIVE_TEXT = re.compile(
    r"\b(DROP\s+(TABLE|SCHEMA|COLUMN)|TRUNCATE|ALTER\s+COLUMN\s+\S+\s+(SET\s+DATA\s+)?TYPE)\b", re.I
)
"""Destructive keywords searched for in the text of a statement sqlglot could not parse."""
DESTRUCTIVE_BEFORE_MARKER = {
    "0014_search_per_language.sql": "TRUNCATE of the derived term statistics, refilled by the same migration",
}
"""Recorded migrations with a destructive statement and no marker (applied SQL is never edited)."""


LOCKS_MARKER = re.compile(r"kb:locks\s+\S")
VOLATILE_DEFAULTS = frozenset({"random", "gen_random_uuid", "uuid", "clock_timestamp", "timeofday", "nextval"})
"""Functions whose value differs per row: a column added with one as its default rewrites the table."""
REWRITE_TEXT = re.compile(r"^\s*(VACUUM\s+(\(\s*)?FULL\b|CLUSTER\b)", re.I)
"""Rewrites kept unparsed by sqlglot."""
LOCKING_BEFORE_MARKER = {
    "0013_search_latency_indexes.sql": "indexes on kb.chunks built under its lock (the upgrade's pause)",
    "0014_search_per_language.sql": "kb.lexeme_stats emptied by the same migration before its new column",
    "0016_chunk_token_lengths.sql": "kb.chunks rewritten for a stored column; its comment gives the pause",
    "0022_create_nodes.sql": "an index on kb.workspaces, one row per workspace",
}
"""Recorded migrations with a long-locking statement and no marker (applied SQL is never edited)."""

UNRECORDED = "not recorded in CHECKSUMS: run python bin/lint_migrations.py --record"


@dataclass(frozen=True)
class Finding:
    """One lint failure: the file (or CHECKSUMS) and what is wrong and what to do."""

    file: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}: {self.message}"


def sha256(path: Path) -> str:
    """sha256 hex of a file's bytes (the same digest kb's migration ledger stores)."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_checksums(folder: Path) -> dict[str, str]:
    """``{file name: sha256}`` from ``folder/CHECKSUMS`` in recorded order ({} when absent)."""
    path = folder / CHECKSUMS
    if not path.exists():
        return {}
    recorded = {}
    for line in path.read_text().splitlines():
        if line.strip():
            digest, name = line.split(maxsplit=1)
            recorded[name.strip()] = digest
    return recorded


def migration_paths(folder: Path) -> list[Path]:
    """Every ``*.sql`` file of the folder, sorted by name."""
    return sorted(folder.glob("*.sql"))


def check_sequence(folder: Path) -> list[Finding]:
    """Names, numbers and checksums: recorded files unchanged, new files named and numbered."""
    findings = []
    recorded = read_checksums(folder)
    paths = {path.name: path for path in migration_paths(folder)}
    for name, digest in recorded.items():
        if name not in paths:
            findings.append(
                Finding(name, "recorded in CHECKSUMS but missing: migrations are append-only, restore the file")
            )
        elif sha256(paths[name]) != digest:
            findings.append(
                Finding(
                    name,
                    "changed after it was recorded: an applied migration is never "
                    "edited, undo the edit and add a new migration instead",
                )
            )
    numbers: dict[int, str] = {}
    for name in sorted(paths, key=lambda n: (n not in recorded, n)):  # a clash is the new file's fault
        match = NAME.match(name)
        if match is None:
            findings.append(Finding(name, "name is not NNNN_verb_object.sql (four digits, lower-case words)"))
            continue
        number = int(match.group(1))
        if number in numbers:
            findings.append(Finding(name, f"number {number:04d} is already used by {numbers[number]}"))
            continue
        numbers[number] = name
    last = max((int(NAME.match(n).group(1)) for n in recorded if NAME.match(n)), default=0)
    expected = last + 1
    for number, name in sorted(numbers.items()):
        if name in recorded:
            continue
        if name.split("_")[1] not in VERBS:
            findings.append(
                Finding(
                    name,
                    f"name should start with a verb ({', '.join(sorted(VERBS))}) "
                    "then the object, e.g. 0020_add_chunk_language.sql",
                )
            )
        if number != expected:
            findings.append(
                Finding(
                    name,
                    f"new migration should be number {expected:04d} (the next after the "
                    "last recorded one; no gaps, no numbers below it)",
                )
            )
        findings.append(Finding(name, UNRECORDED))
        expected = number + 1
    return findings


def _statement_text(statement: exp.Expression) -> str:
    """The statement as SQL; for a Command (kept unparsed), its keyword and raw remaining text."""
    if not isinstance(statement, exp.Command):
        return statement.sql(dialect="postgres")
    rest = statement.args.get("expression")
    rest = rest.name if isinstance(rest, exp.Expression) else str(rest or "")
    return f"{statement.this} {rest.lstrip()}"


def destructive(statement: exp.Expression) -> str | None:
    """What makes ``statement`` destructive (e.g. ``"TRUNCATE"``), or None."""
    if isinstance(statement, exp.Command):
        found = DESTRUCTIVE_TEXT.search(_statement_text(statement))
        return " ".join(found.group(0).split()).upper() if found else None
    if isinstance(statement, exp.Drop) and (statement.args.get("kind") or "").upper() in ("TABLE", "SCHEMA"):
        return f"DROP {statement.args['kind'].upper()}"
    if isinstance(statement, exp.TruncateTable):
        return "TRUNCATE"
    if isinstance(statement, exp.Delete) and not statement.args.get("where"):
        return "DELETE without WHERE"
    if isinstance(statement, exp.Alter):
        for action in statement.args.get("actions") or []:
            if isinstance(action, exp.Drop) and (action.args.get("kind") or "").upper() == "COLUMN":
                return "DROP COLUMN"
            if isinstance(action, exp.AlterColumn) and action.args.get("dtype") is not None:
                return "ALTER COLUMN … TYPE"
    return None


def _table_name(table: exp.Expression | None) -> str:
    """``schema.table`` (or ``table``) of a sqlglot Table, lower case; "" when none."""
    if not isinstance(table, exp.Table):
        return ""
    return ".".join(part for part in (table.db, table.name) if part).lower()


def created_tables(statements: list[exp.Expression]) -> set[str]:
    """The tables the migration itself creates (empty when it runs: no lock on them is long)."""
    return {
        _table_name(s.this.this if isinstance(s.this, exp.Schema) else s.this)
        for s in statements
        if isinstance(s, exp.Create) and (s.args.get("kind") or "").upper() == "TABLE"
    }


def long_locking(statement: exp.Expression, new_tables: set[str]) -> str | None:
    """What makes ``statement`` hold a write-blocking lock for as long as an existing table is big
    (e.g. ``"CREATE INDEX on kb.chunks"``), or None. ``new_tables``: tables the same migration
    creates, exempt."""
    if isinstance(statement, exp.Command):
        found = REWRITE_TEXT.match(_statement_text(statement))
        return " ".join(found.group(1).replace("(", "").split()).upper() if found else None
    if isinstance(statement, exp.Create) and (statement.args.get("kind") or "").upper() == "INDEX":
        index = statement.this
        table = _table_name(index.args.get("table") if isinstance(index, exp.Index) else None)
        if statement.args.get("concurrently"):
            return "CREATE INDEX CONCURRENTLY (it cannot run in the migration's transaction)"
        return None if table in new_tables else f"CREATE INDEX on {table}"
    if isinstance(statement, exp.Update) and not statement.args.get("where"):
        table = _table_name(statement.this)
        return (
            None if table in new_tables else f"UPDATE of every row of {table} (locks each until the migration commits)"
        )
    if not isinstance(statement, exp.Alter) or (statement.args.get("kind") or "").upper() != "TABLE":
        return None
    table = _table_name(statement.this)
    if table in new_tables:
        return None
    for action in statement.args.get("actions") or []:
        if isinstance(action, exp.ColumnDef):
            kinds = [c.args.get("kind") for c in action.args.get("constraints") or []]
            default = next((k for k in kinds if isinstance(k, exp.DefaultColumnConstraint)), None)
            if default is None and any(isinstance(k, exp.NotNullColumnConstraint) for k in kinds):
                return f"ADD COLUMN … NOT NULL without a default on {table}"
            calls = [] if default is None else [f.sql_name().lower() for f in default.find_all(exp.Func)]
            calls += [] if default is None else [a.name.lower() for a in default.find_all(exp.Anonymous)]
            if VOLATILE_DEFAULTS & set(calls):
                return f"ADD COLUMN with a volatile default on {table} (rewrites it)"
            if any(
                isinstance(k, exp.ComputedColumnConstraint | exp.GeneratedAsIdentityColumnConstraint) for k in kinds
            ):
                return f"ADD COLUMN … GENERATED on {table} (rewrites it)"
        if isinstance(action, exp.AlterColumn) and action.args.get("allow_null") is False:
            return f"SET NOT NULL on {table} (scans it)"
        if isinstance(action, exp.AddConstraint):
            for constraint in action.expressions:
                if constraint.find(exp.UniqueColumnConstraint, exp.PrimaryKey, exp.PrimaryKeyColumnConstraint):
                    return f"ADD CONSTRAINT … UNIQUE/PRIMARY KEY on {table} (builds an index)"
                if not statement.args.get("not_valid") and constraint.find(exp.CheckColumnConstraint, exp.ForeignKey):
                    return f"ADD CONSTRAINT without NOT VALID on {table} (scans it)"
    return None


def check_statements(path: Path) -> list[Finding]:
    """Parse every statement of one migration; report unparsable and unmarked destructive ones."""
    text = re.sub(r"%\((\w+)\)[sbt]", "NULL", path.read_text())  # psycopg placeholders (text, binary, automatic)
    try:
        statements = [s for s in sqlglot.parse(text, read="postgres") if s is not None]
    except sqlglot.errors.ParseError as exc:
        return [Finding(path.name, f"does not parse as postgres SQL: {str(exc).splitlines()[0]}")]
    findings = []
    new_tables = created_tables(statements)
    for statement in statements:
        locking = long_locking(statement, new_tables)
        if (
            locking is not None
            and not any(LOCKS_MARKER.search(c) for c in statement.comments or [])
            and path.name not in LOCKING_BEFORE_MARKER
        ):
            findings.append(
                Finding(
                    path.name,
                    f"{locking} blocks writes to the table for as long as it is big (migrations run in one "
                    "transaction): put '-- kb:locks <reason>' on the line before the statement (why the "
                    "table is small or the pause acceptable), or do it outside the migration",
                )
            )
        if isinstance(statement, exp.Command):
            head = _statement_text(statement).lstrip()
            if not any(pattern.match(head) for pattern, _ in UNPARSED_ALLOWED):
                findings.append(
                    Finding(
                        path.name,
                        f"sqlglot cannot parse {head[:60]!r}: write it in a form it "
                        "parses, or add the form to UNPARSED_ALLOWED with a reason",
                    )
                )
        what = destructive(statement)
        if what is None or any(MARKER.search(c) for c in statement.comments or []):
            continue
        if path.name in DESTRUCTIVE_BEFORE_MARKER:
            continue
        findings.append(
            Finding(
                path.name,
                f"{what} without a marker: put '-- kb:destructive <reason>' on the "
                "line before the statement (what is lost and why that is safe)",
            )
        )
    return findings


def lint(folder: Path = MIGRATIONS) -> list[Finding]:
    """Every finding for the migrations in ``folder`` (empty when clean)."""
    findings = check_sequence(folder)
    for path in migration_paths(folder):
        findings.extend(check_statements(path))
    return findings


def record(folder: Path = MIGRATIONS) -> list[str]:
    """Append the sha256 line of every migration not yet in CHECKSUMS; returns their names."""
    recorded = read_checksums(folder)
    new = [path for path in migration_paths(folder) if path.name not in recorded]
    with (folder / CHECKSUMS).open("a") as out:
        for path in new:
            out.write(f"{sha256(path)}  {path.name}\n")
    return [path.name for path in new]


def main(argv: list[str] | None = None) -> int:
    """Command line: lint (default) or ``--record`` new files; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=MIGRATIONS, help="folder of migrations (default: migrations/)")
    parser.add_argument("--record", action="store_true", help="append new files' checksums to CHECKSUMS")
    args = parser.parse_args(argv)
    logging.getLogger("sqlglot").setLevel(logging.ERROR)  # the Command fallback is judged above
    findings = lint(args.dir)
    if args.record and not [f for f in findings if f.message != UNRECORDED]:
        for name in record(args.dir):
            print(f"recorded {name}")
        findings = lint(args.dir)
    for finding in findings:
        print(finding, file=sys.stderr)
    if findings:
        return 1
    print(f"migrations: {len(migration_paths(args.dir))} files clean")
    return 0


if __name__ == "__main__":
    sys.exit(main())
