"""Documents created by title (design §2.2, §5): the path law picks the file name, the title is kept.

``create(folder, title, body)`` on a transaction's draft or a turn picks ``safe_filename(title)``
in ``folder``, suffixed `` (2)``, `` (3)`` … when the name is taken (case- and NFC-insensitively)
by a document or folder of the draft's view, and returns a :class:`TitledDocument`. When the
revision is recorded, under the workspace write lock, the name is checked again against the
*current* head: if a commit that landed meanwhile took it, the next free name is chosen then
(:func:`rename_taken`) and the TitledDocument's ``path`` says where the document went.

The title as typed is recorded with the revision (``kb.recorded_titles``, written in the same
transaction as the revision row) and the projection copies it into ``kb.documents.title`` (design
§6: Postgres owns titles). ``retitle(path, title)`` moves the document to its new name — a
recorded move, so the row keeps its id — and records the new title.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kb.db.sql import queries
from kb.errors import InvalidInput
from kb.paths import NameRegistry, name_key, safe_filename

if TYPE_CHECKING:
    from kb.db.database import Connection


@dataclass
class TitledDocument:
    """A document named from its title. ``path`` is the virtual path chosen so far; once the
    transaction or turn has committed it is the final path (it may differ from the first choice
    when a racing commit took the name, design §2.2). ``title`` is exactly as the caller typed it."""

    title: str
    path: str

    @property
    def repo_path(self) -> str:
        """``documents/...`` form of :attr:`path`."""
        return self.path[1:]


def folder_and_name(repo_path: str) -> tuple[str, str]:
    """``("documents/a", "b.md")`` for ``"documents/a/b.md"``."""
    folder, _, name = repo_path.rpartition("/")
    return folder, name


def check_title(title: object) -> str:
    """Return ``title`` if it can be kept exactly as typed: a str without NUL (Postgres text
    cannot hold NUL) that encodes as UTF-8. Raises TypeError for a non-str, InvalidInput for a NUL
    or a lone surrogate."""
    if not isinstance(title, str):
        raise TypeError(f"title must be str, not {type(title).__name__}")
    if "\0" in title:
        raise InvalidInput(f"title {title!r} contains a NUL character, which Postgres text cannot hold; remove it")
    try:
        title.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: bytes that were not UTF-8 (argv, a file name)
        raise InvalidInput(
            f"title {title!r} is not valid Unicode text (bytes that were not UTF-8); pass UTF-8 text"
        ) from None
    return title


def choose_name(title: str, taken: Iterable[str]) -> str:
    """The file name for ``title`` in a folder whose entries are ``taken`` (names): the path law's
    ``safe_filename`` plus the first free `` (n)`` suffix (design §2.2). Raises TypeError for a
    non-str title, InvalidInput for a title with NUL."""
    return NameRegistry(taken).claim(safe_filename(check_title(title)))


def name_taken_since(name: str, now: set[str], at_base: set[str], own: set[str]) -> str | None:
    """None when ``name`` (chosen free among the names ``at_base``) is still free among the names
    that appeared since (``now - at_base``); else the next free name among ``now`` and the writer's
    ``own`` other names in that folder (design §2.2 collisions, case- and NFC-insensitive)."""
    if name_key(name) not in {name_key(n) for n in now - at_base}:
        return None
    return NameRegistry(now | own).claim(name)


def rename_taken(repo, draft, staged: dict[str, str | None], head_tree: bytes | None) -> dict[str, str | None]:
    """Under the write lock: give every document this draft named by title, whose name a commit
    that landed since the draft's base has taken in the current head, the next free name.

    ``repo`` is the workspace's Repository, ``draft`` a ``kb.store.draft.Draft``, ``staged`` ``{repo
    path: blob or None}``. Returns the staged map with such paths renamed; the draft's entries and
    its TitledDocuments are renamed with them. Documents that kept their name are untouched.
    """
    if not draft.titles():
        return staged
    staged = dict(staged)
    for path in sorted(draft.titles()):
        if staged.get(path) is None or draft.origin_of(path) == path:
            continue  # removed meanwhile in the draft, or retitled to its own name
        folder, name = folder_and_name(path)
        at_base = {n for n, _ in repo.list_folder(draft.base_tree, folder)}
        at_head = {
            n for n, _ in repo.list_folder(head_tree, folder) if staged.get(f"{folder}/{n}", "absent") is not None
        }  # names the draft removes are free
        ours = {
            folder_and_name(p)[1]
            for p, blob in staged.items()
            if blob is not None and p != path and folder_and_name(p)[0] == folder
        }
        new_name = name_taken_since(name, at_head, at_base, ours)
        if new_name is None:
            continue
        new_path = f"{folder}/{new_name}"
        staged[new_path] = staged.pop(path)
        if repo.lookup(draft.base_tree, path) is not None:  # it replaced the base's document there
            staged[path] = None
        draft.rename_entry(path, new_path)
    return staged


def record_titles(conn: Connection, workspace_id: int, seq: int, titles: dict[str, str]) -> None:
    """Record ``{repo path: title}`` given with revision ``seq`` (in the revision's transaction);
    the projection copies them into ``kb.documents.title`` (design §6)."""
    if not titles:
        return
    with conn.cursor() as cur:
        cur.executemany(
            queries["insert_recorded_title"],
            [
                {"workspace_id": workspace_id, "seq": seq, "path": "/" + path, "title": title}
                for path, title in titles.items()
            ],
        )


def recorded_title(conn: Connection, workspace_id: int, path: str) -> str | None:
    """The title last recorded for virtual ``path`` (``kb.recorded_titles``), or None: what a
    document created by title is called before the projection copies it into its row."""
    row = conn.execute(queries["latest_recorded_title"], {"workspace_id": workspace_id, "path": path}).fetchone()
    return None if row is None else row["title"]
