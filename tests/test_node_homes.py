"""design §15: home nodes in one process — a new workspace is homed on its creating node; one
made before nodes existed is adopted by the node holding its repository and by no other; another
node may neither create nor delete it; a second storage cannot take a node's name; node names are
checked."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from support.named_queries import queries

from kb import KnowledgeBase, Settings
from kb.db import database, nodes
from kb.errors import ConfigurationError, WrongNode


def test_homes_adoption_and_names(kb, settings, tmp_path):
    kb.create_workspace(1)
    with kb.transaction(1, "one", "alice") as tx:
        tx.write("/documents/One.md", "one\n")
    assert kb.workspace_home(1).node == settings.node == kb.status(1)["workspace"]["home_node"]
    with database.connect(kb.database_url, autocommit=True) as conn:
        conn.execute(queries["test_forget_home_node"], {"workspace_id": 1})
    # another node, whose storage does not hold the repository, never adopts it
    other = KnowledgeBase.open(settings.model_copy(update={"node": "elsewhere", "storage_root": tmp_path / "b"}))
    other.register_node("http://127.0.0.1:9")
    home = other.workspace_home(1)
    assert home is not None and home.node is None
    with pytest.raises(ConfigurationError, match="'elsewhere' is registered with the storage root"):
        KnowledgeBase.open(settings.model_copy(update={"node": "elsewhere"})).register_node()
    # the node holding it adopts it (the upgrade path), atomically: the first one wins
    kb.register_node()
    assert kb.workspace_home(1).node == settings.node and other.workspace_home(1).node == settings.node
    with pytest.raises(WrongNode, match=f"homed on node '{settings.node}'"):
        other.create_workspace(1)
    with pytest.raises(WrongNode, match=f"homed on node '{settings.node}'"):
        other.delete_workspace(1, force=True)  # its repository is not here: it would be orphaned
    assert kb.head(1) is not None
    assert not (tmp_path / "b" / "knowledge_store" / "1").exists()
    # after a move flipped the home away, the copy left here is not written to (nor marked diverged)
    with database.transaction(kb.database_url) as conn:
        assert nodes.set_home(conn, 1, "elsewhere", settings.node)
    with pytest.raises(WrongNode, match="homed on node 'elsewhere'"):
        with kb.transaction(1, "two", "alice") as tx:
            tx.write("/documents/Two.md", "two\n")
    assert kb.workspaces()[0]["diverged"] is None and [r.message for r in kb.history(1)] == ["one"]
    listed = {n.name: n for n in kb.nodes()}
    assert listed[settings.node].workspaces == 0 and listed["elsewhere"].workspaces == 1
    assert listed["elsewhere"].url == "http://127.0.0.1:9"
    with pytest.raises(ValidationError, match="not a node name"):
        Settings(node="host name with spaces")
    other.close()


def test_the_paths_forwarding_routes_name_their_workspace():
    from kb.adapters.http.forwarding import workspace_of

    def ws(path: str, query: bytes = b"") -> int | None:
        return workspace_of({"path": path, "query_string": query})

    assert [ws("/v1/workspaces/3/search"), ws("/ui/workspaces/12/documents/a.md"), ws("/mcp/4")] == [3, 12, 4]
    assert ws("/v1/status", b"workspace=7") == 7 and ws("/v1/status") is None
    assert [ws("/mcp/not-a-workspace"), ws("/ui/operator"), ws("/v1/workspaces"), ws("/health")] == [None] * 4
    # an MCP path names a workspace only as the MCP routing reads it (/mcp/<id>), never one of several
    assert [ws("/mcp/4/"), ws("/mcp/1/2"), ws("/mcp//2"), ws("/mcp/1/x"), ws("/mcp")] == [4, None, None, None, None]
    # as the routes and the token check read them: the last of repeated parameters, ASCII digits only
    assert ws("/v1/status", b"workspace=1&workspace=2") == 2
    assert [ws("/v1/workspaces/\u0662/search"), ws("/mcp/\uff12"), ws("/v1/status", "workspace=\u0662".encode())] == [
        None
    ] * 3
