"""Named queries (design §12): every query a .sql file defines is used, every name used is defined,
the QueryName Literal matches the files, and test/benchmark queries stay out of kb's sql/."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path
from typing import get_args

from support.named_queries import UNSHIPPED_DIRS, load_unshipped_queries

from kb.db.query_names import QueryName
from kb.db.sql import load_queries, sql_root

ROOT = Path(__file__).resolve().parents[1]
ACCESSORS = {"queries", "composable", "run_admin", "_rows", "_row"}
"""Names through which code takes a named query by a literal name (``queries["x"]``, ``composable("x")``,
and the tests' helpers that pass a name on)."""


def _python_files(*folders: str) -> list[Path]:
    return sorted(
        p
        for folder in folders
        for p in (ROOT / folder).rglob("*.py")
        if ".venv" not in p.parts and "node_modules" not in p.parts
    )


def _string_constants(path: Path) -> set[str]:
    return {
        node.value
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }


def _literal_names(node: ast.AST) -> list[str]:
    """The string literals a name argument can take: ``"x"`` or ``"x" if c else "y"``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.IfExp):
        return _literal_names(node.body) + _literal_names(node.orelse)
    return []


def _accessor(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def names_used(path: Path) -> list[tuple[int, str]]:
    """``(line, name)`` of each query name the file takes by literal through an accessor."""
    used = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Subscript) and _accessor(node.value) == "queries":
            used += [(node.lineno, name) for name in _literal_names(node.slice)]
        elif isinstance(node, ast.Call) and _accessor(node.func) in ACCESSORS and node.args:
            argument = node.args[0] if _accessor(node.func) == "composable" else node.args[1:2]
            for arg in argument if isinstance(argument, list) else [argument]:
                used += [(node.lineno, name) for name in _literal_names(arg)]
    return used


def _write_query_names():
    spec = importlib.util.spec_from_file_location("write_query_names", ROOT / "bin" / "write_query_names.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_query_name_literal_matches_the_sql_files():
    assert set(get_args(QueryName)) == set(load_queries())
    generated = _write_query_names().query_names_module()
    assert (ROOT / "kb" / "db" / "query_names.py").read_text() == generated, (
        "kb/db/query_names.py is out of date: run python bin/write_query_names.py"
    )


def test_every_shipped_query_is_used_by_kb():
    used = set().union(*(_string_constants(p) for p in _python_files("kb") if p.name != "query_names.py"))
    assert sorted(set(load_queries()) - used) == [], "named queries nothing in kb runs: remove them"


def test_every_test_or_benchmark_query_is_used_by_tests_or_bin():
    used = set().union(*(_string_constants(p) for p in _python_files("tests", "bin")))
    assert sorted(set(load_unshipped_queries()) - used) == [], "named queries no test or benchmark runs"


def test_every_query_name_used_is_defined():
    shipped, unshipped = set(load_queries()), set(load_unshipped_queries())
    missing = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for path in _python_files("kb")
        for line, name in names_used(path)
        if name not in shipped
    ]
    missing += [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for path in _python_files("tests", "bin")
        for line, name in names_used(path)
        if name not in shipped | unshipped
    ]
    assert missing == []


def test_the_scan_sees_names_used():
    """The check above would pass vacuously if the scan found nothing."""
    kb_names = {name for path in _python_files("kb") for _, name in names_used(path)}
    test_names = {name for path in _python_files("tests", "bin") for _, name in names_used(path)}
    assert {"lexical_leg", "flip_seed", "unflip_seed", "delete_workspace"} <= kb_names
    assert {"drop_database", "test_chunk_set", "bench_vector_leg"} <= test_names


def test_test_and_benchmark_queries_do_not_ship():
    shipped_files = {p.name for p in (sql_root() / "queries").glob("*.sql")}
    assert not shipped_files & {"testing.sql", "bench.sql"}
    assert all(folder.is_dir() and list(folder.glob("*.sql")) for folder in UNSHIPPED_DIRS)
    assert not [n for n in load_queries() if n.startswith(("test_", "bench_", "eval_"))]
