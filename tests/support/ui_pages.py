"""What the pages' tests share (design §17): a workspace with history worth showing — an import,
an agent's edit recorded with a ``Turn:`` trailer, a move — and a document the index quarantined,
all made through the library before the server starts; and the check that a page names nothing
outside the server."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

from kb.knowledge_base import KnowledgeBase
from kb.settings import Settings
from support.core_flow import write_tree
from support.embedders import PoisonEmbedder

WORKSPACE = 1
NOTES = {
    "Billing/Refunds.md": "# Refunds\n\nAn annual subscription is refunded in full within 30 days.\nMonthly plans are not.\n",
    "Guides/Install.md": "# Install\n\nRun the installer, then sign in.\n",
    "Broken.md": "# Broken\n\nPOISON: the model rejects this page.\n",
}
EDITED = "# Refunds\n\nAn annual subscription is refunded in full within 60 days.\nMonthly plans are not.\n"
EDIT_MESSAGE = "refunds: 60 days"
"""The message of the agent's turn ``agent-7``, whose commit adds the trailer ``Turn: agent-7``."""


def make_token(settings: Settings, name: str, scope: str, workspaces: list[int] | None = None) -> str:
    """A new API token's secret (design §16): ``scope`` on ``workspaces`` (None: every one)."""
    with KnowledgeBase.open(settings) as kb:
        return kb.tokens().create(name, scope, workspaces, None)[1]


def make_workspace(settings: Settings, folder: Path) -> dict[str, str]:
    """Import NOTES, edit the refunds page as an agent's turn, move the install guide, and index
    with a model that rejects ``Broken.md`` once (``max_attempts=1``: quarantined at once, so the
    server's worker leaves it for a person's retry). Returns the revision ids by name."""
    kb = KnowledgeBase.open(settings.model_copy(update={"max_attempts": 1}))
    kb.use_embedder(PoisonEmbedder())
    kb.import_folder(write_tree(folder, NOTES), WORKSPACE, message="import the notes")
    imported = kb.head(WORKSPACE)
    agent = kb.turn(WORKSPACE, "agent-7", author="agent")  # only a turn's commit writes a trailer
    agent.write("/documents/Billing/Refunds.md", EDITED)
    agent.commit(EDIT_MESSAGE)
    with kb.transaction(WORKSPACE, "move the install guide", "bob") as tx:
        tx.move("/documents/Guides/Install.md", "/documents/Setup/Install.md")
    report = kb.index(WORKSPACE)
    assert kb.status(WORKSPACE)["workspace"]["quarantined"] == 1, report
    revisions = {"import": imported, "edit": tx_revision(kb, 2), "move": tx_revision(kb, 3)}
    kb.close()
    return revisions


def tx_revision(kb: KnowledgeBase, seq: int) -> str:
    """The id of the workspace's revision number ``seq``."""
    return next(r.id for r in kb.history(WORKSPACE, None, 50) if r.seq == seq)


class _Urls(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in ("src", "href", "action", "data-live", "srcset", "poster", "data") and value:
                self.urls.append(value)


CSS_URL = re.compile(r"url\(\s*['\"]?([^'\")]+)")


def outside_urls(html: str) -> list[str]:
    """The URLs a page (HTML or CSS) names that leave the server: any with a scheme or ``//``
    host other than ``data:`` (fragment links and paths on this server are fine)."""
    parser = _Urls()
    parser.feed(html)
    urls = parser.urls + CSS_URL.findall(html)
    return [u for u in urls if re.match(r"^([a-z][a-z0-9+.-]*:|//)", u.strip(), re.I) and not u.startswith("data:")]
