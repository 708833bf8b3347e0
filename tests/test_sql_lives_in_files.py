"""design §12: SQL lives in ``.sql`` files (schema, numbered migrations, named queries loaded by
name); kb's Python passes no statement text of its own to Postgres. The check reads kb's source:
no ``execute``/``executemany``/``copy``/``stream`` call is given a string literal (plain or
f-string), the form a statement written in Python takes."""

from __future__ import annotations

import ast
from pathlib import Path

import kb

CALLS = frozenset({"execute", "executemany", "copy", "stream"})


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
            found.append(f"{path.relative_to(Path(kb.__file__).parent.parent)}:{node.lineno}")
    return found


def test_no_statement_text_in_kbs_python():
    package = Path(kb.__file__).parent
    found = [where for path in sorted(package.rglob("*.py")) for where in _literal_statements(path)]
    assert found == [], f"SQL written in Python (move it to sql/queries/*.sql and load it by name): {found}"
