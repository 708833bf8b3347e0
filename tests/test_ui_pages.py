"""design §16, §17: the pages under /ui as plain HTTP (no JavaScript) against a real ``kb serve``:
a person logs in with an API token (a cookie), every page answers HTML naming nothing outside the server, the document page numbers lines truly
and names each line's last change, the revision page shows an edit's diff and a move as a
rename, a revert needs the write scope and the anti-forgery token and records a new revision
naming the token, the live stream relays
the workspace's change events, and /docs loads Swagger UI from the server itself."""

from __future__ import annotations

import re

import pytest
from support.kb_server import running_server
from support.ui_pages import WORKSPACE, make_token, make_workspace, outside_urls

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi", reason="kb serve needs the serve extra (pip install -e '.[serve]')")


def test_pages_without_javascript(settings, kb_env, tmp_path):
    revisions = make_workspace(settings, tmp_path / "notes")
    writer, reader = make_token(settings, "ui-writer", "write"), make_token(settings, "ui-reader", "read", [1])
    with running_server(kb_env, tmp_path / "serve.log") as url, httpx.Client(base_url=url, timeout=60) as web:
        ws = f"/ui/workspaces/{WORKSPACE}"
        api = {"Authorization": f"Bearer {writer}"}
        # no token: to the login page, which refuses a wrong token and keeps a right one in a cookie
        away = web.get(ws)
        assert away.status_code == 303 and away.headers["location"] == f"/ui/login?next={ws}"
        form = web.get(away.headers["location"]).text
        login = {"csrf": re.search(r'name="csrf" value="([^"]+)"', form).group(1), "next": ws}
        assert web.post("/ui/login", data={**login, "token": "kb_wrong"}).status_code == 401
        entered = web.post("/ui/login", data={**login, "token": writer})
        assert entered.status_code == 303 and entered.headers["location"] == ws
        cookie = entered.headers["set-cookie"]
        assert "kb_token=" in cookie and "HttpOnly" in cookie and "SameSite=strict" in cookie
        pages = {
            "/ui": "Workspace 1",
            ws: "move the install guide",
            f"{ws}/folders/": "Billing/",
            f"{ws}/documents/Billing/Refunds.md?lines=3-3": "within 60 days",
            f"{ws}/revisions/{revisions['edit']}": "agent-7",
            f"{ws}/search?q=annual+subscription+refund": "Refunds",
            "/ui/operator": "Broken.md",
            "/ui/login": "Token",
            f"{ws}/revisions/{revisions['edit']}/revert": "Revert",
        }
        for page, text in pages.items():
            answer = web.get(page)
            assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/html"), page
            assert text in answer.text, (page, answer.text)
            assert outside_urls(answer.text) == [], page
            assert "default-src 'self'" in answer.headers["content-security-policy"]
        css = web.get("/ui/static/ui.css")
        assert css.status_code == 200 and outside_urls(css.text) == []

        # the document: true line numbers, the marked line, each line's last change
        document = web.get(f"{ws}/documents/Billing/Refunds.md?lines=3-3").text
        marked = re.search(r'<tr class="marked">\s*<th scope="row" id="L(\d+)">.*?</tr>', document, re.S)
        assert marked and marked.group(1) == "3" and "within 60 days" in marked.group(0)
        assert f"/revisions/{revisions['edit']}" in marked.group(0)  # line 3 last changed by the edit
        assert f"/revisions/{revisions['import']}" in document  # line 1 by the import

        # the revision pages: an edit's diff with old and new line numbers, a move as a rename
        edit = web.get(f"{ws}/revisions/{revisions['edit']}").text
        assert re.search(r'<tr class="removed"><td class="num">3</td>.*?within 30 days', edit)
        assert re.search(r'<tr class="added"><td class="num"></td><td class="num">3</td>.*?within 60 days', edit)
        move = web.get(f"{ws}/revisions/{revisions['move']}").text
        assert "renamed <code>/documents/Guides/Install.md</code> →" in move and "only the path changed" in move

        # an unknown revision is a page saying so, with the API's status
        missing = web.get(f"{ws}/revisions/{'0' * 40}")
        assert missing.status_code == 404 and "RevisionNotFound" in missing.text

        # a revert without the token, or from another site, records nothing
        revert = f"{ws}/revisions/{revisions['edit']}/revert"
        token = re.search(r'name="csrf" value="([^"]+)"', web.get(revert).text).group(1)
        assert web.post(revert, data={"csrf": "forged"}).status_code == 403
        foreign = web.post(revert, data={"csrf": token}, headers={"Origin": "http://evil.example"})
        assert foreign.status_code == 403
        with httpx.Client(base_url=url, timeout=60, cookies={"kb_token": reader}) as read_only:
            assert read_only.get(ws).status_code == 200  # a read token reads
            read_token = re.search(r'name="csrf" value="([^"]+)"', read_only.get(revert).text).group(1)
            refused = read_only.post(revert, data={"csrf": read_token})
            assert refused.status_code == 403 and "ScopeRefused" in refused.text  # but may not revert
            assert read_only.get("/ui/workspaces/2").status_code == 404  # nor see another workspace
        head = web.get(f"/v1/workspaces/{WORKSPACE}/log?limit=1", headers=api).json()[0]["id"]
        assert head == revisions["move"]

        # the live stream relays the change events of the revert's projection
        with web.stream("GET", f"{ws}/events") as stream:
            assert stream.headers["content-type"].startswith("text/event-stream")
            done = web.post(revert, data={"csrf": token})
            assert done.status_code == 303 and "reverted=" in done.headers["location"]
            seen = ""
            for chunk in stream.iter_text():
                seen += chunk
                if "event: change" in seen:
                    break
        assert '"workspace_id": 1' in seen
        log = web.get(f"/v1/workspaces/{WORKSPACE}/log?limit=1", headers=api).json()[0]
        assert log["message"].startswith('Revert "refunds: 60 days"') and log["parent_id"] == revisions["move"]
        assert log["committer"].startswith("ui-writer <kb-token-")  # the token that reverted
        top = web.get(done.headers["location"]).text
        assert top.index(log["id"][:12]) < top.index(revisions["move"][:12])

        # the OpenAPI page loads Swagger UI from this server
        docs = web.get("/docs").text
        assert outside_urls(docs) == []
        for asset in re.findall(r'(?:src|href)="(/docs-assets/[^"]+)"', docs):
            assert web.get(asset).status_code == 200, asset
