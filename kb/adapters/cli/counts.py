"""How the CLI words a count in its reports: ``1 document``, ``2 documents``, ``0 documents``."""

from __future__ import annotations


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """``count`` followed by ``noun``, in the plural unless ``count`` is exactly one.

    Args: ``count`` how many; ``noun`` the singular ("document"); ``plural`` where adding "s" is
    wrong ("batches"). Returns e.g. ``"1 document"``, ``"3 documents"``."""
    return f"{count} {noun if count == 1 else (plural or noun + 's')}"
