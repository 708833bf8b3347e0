"""The test suite's shape: fixtures live in conftest, shared functions in tests/support/, and no
test module imports conftest or another test module (pytest loads conftest itself; a second import
of it, as ``conftest`` or ``tests.conftest``, is a second copy of every module-level object)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def imported_modules(path: Path) -> set[str]:
    """The modules ``path`` imports, at any depth (``from a.b import c`` gives ``a.b``)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def test_no_test_imports_conftest_or_another_test_module():
    offenders = []
    for path in sorted([*TESTS.glob("*.py"), *(TESTS / "support").glob("*.py")]):
        for module in imported_modules(path):
            last = module.rsplit(".", 1)[-1]
            if last == "conftest" or (last.startswith("test_") and module.split(".")[0] in ("tests", last)):
                offenders.append(f"{path.relative_to(TESTS)} imports {module}")
    assert not offenders, (
        "import shared functions from tests/support/ (fixtures come from conftest by name):\n" + "\n".join(offenders)
    )
