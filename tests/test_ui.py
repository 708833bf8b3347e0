"""design §16, §17: the pages under /ui against one real ``kb serve`` (its in-process worker
running) over a workspace made through the library: an import, an agent's edit recorded with a
``Turn:`` trailer, a move, and a document the model rejected (quarantined).

- As plain HTTP, no JavaScript: a person logs in with an API token (a cookie); every page answers
  HTML naming nothing outside the server; the document page numbers lines truly and names each
  line's last change; the revision page shows the edit's diff and the move as a rename; a revert
  needs the write scope and the anti-forgery token, records a new revision naming the token, and
  the live stream relays its change events; /docs loads Swagger UI from the server itself.
- In Debian's headless chromium (selenium; nothing downloaded), the acceptance path: log in, open
  the workspace, search, open a result at its lines, open the revision that last changed them, see
  the diff, revert it and see the new revision at the top; the operator's view shows the
  quarantined document and retrying it clears it; the browser's network log shows no request
  leaving the server.

The two tests share the server (one start, one workspace: CI's time); they run in file order, the
plain one reverting the move, the browser the edit.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil

import psycopg
import pytest
from support.database import fresh_database
from support.kb_server import running_server
from support.ui_pages import WORKSPACE, make_token, make_workspace, outside_urls
from support.waiting import wait_until

from kb.settings import Settings

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi", reason="kb serve needs the serve extra (pip install -e '.[serve]')")

CHROMEDRIVER = shutil.which("chromedriver")


@pytest.fixture(scope="module")
def served(pg_server, template_url, tmp_path_factory, shared_model_cache):
    """``(base URL, {revision name: id}, {token name: secret})`` of a running kb serve."""
    root = tmp_path_factory.mktemp("ui")
    template = psycopg.conninfo.conninfo_to_dict(template_url)["dbname"]
    with fresh_database(pg_server, template) as url:
        settings = Settings(
            database_url=url, storage_root=root / "storage", embedding_model="hashing", model_cache=shared_model_cache
        )
        revisions = make_workspace(settings, root / "notes")
        tokens = {
            "writer": make_token(settings, "ui-writer", "write"),
            "reader": make_token(settings, "ui-reader", "read", [1]),
            "reviewer": make_token(settings, "reviewer", "write"),
            "streamer": make_token(settings, "ui-streamer", "read", [1]),
            "quitter": make_token(settings, "ui-quitter", "read", [1]),
        }
        env = {k: v for k, v in os.environ.items() if not k.startswith("KB_")}
        env.update(
            KB_DATABASE_URL=url,
            KB_STORAGE_ROOT=str(settings.storage_root),
            KB_EMBEDDING_MODEL="hashing",
            KB_MODEL_CACHE=str(settings.model_cache),
        )
        with running_server(env, root / "serve.log") as base:
            yield base, revisions, tokens


def test_pages_without_javascript(served):
    url, revisions, tokens = served
    writer, reader = tokens["writer"], tokens["reader"]
    with httpx.Client(base_url=url, timeout=60) as web:
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

        # the workspace lists the quarantined document with its reason and a Retry form of its own
        problems = web.get(ws).text
        assert "/documents/Broken.md" in problems and "the model rejected an input" in problems
        assert f'action="{ws}/retry"' in problems

        # the document: true line numbers, the marked line, each line's last change
        document = web.get(f"{ws}/documents/Billing/Refunds.md?lines=3-3").text
        marked = re.search(r'<tr class="marked">\s*<th scope="row" id="L(\d+)">.*?</tr>', document, re.S)
        assert marked and marked.group(1) == "3" and "within 60 days" in marked.group(0)
        assert f"/revisions/{revisions['edit']}" in marked.group(0)  # line 3 last changed by the edit
        assert f"/revisions/{revisions['import']}" in document  # line 1 by the import
        # a range past the end is told, not shown empty; one running past it is cut at the last line
        past = web.get(f"{ws}/documents/Billing/Refunds.md?lines=400-410").text
        assert "are past the end" in past and 'class="marked"' not in past
        huge = web.get(f"{ws}/documents/Billing/Refunds.md?lines=2-2000000000")  # no list of 2e9 numbers
        assert huge.status_code == 200 and "The document ends at line" in huge.text, huge.text[:500]
        # line 0 does not exist: the page says lines start at 1 (it marked nothing, silently)
        zero = web.get(f"{ws}/documents/Billing/Refunds.md?lines=0-3").text
        assert "Lines are numbered from 1" in zero and 'id="L1"' in zero.split('class="marked"')[1], zero[:800]
        assert "names no line" in web.get(f"{ws}/documents/Billing/Refunds.md?lines=0").text

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
        revert = f"{ws}/revisions/{revisions['move']}/revert"
        token = re.search(r'name="csrf" value="([^"]+)"', web.get(revert).text).group(1)
        assert web.post(revert, data={"csrf": "forged"}).status_code == 403
        foreign = web.post(revert, data={"csrf": token}, headers={"Origin": "http://evil.example"})
        assert foreign.status_code == 403
        with httpx.Client(base_url=url, timeout=60, cookies={"kb_token": reader}) as read_only:
            assert read_only.get(ws).status_code == 200  # a read token reads
            # no Operator link for a token of some workspaces only: the operator's view is every
            # workspace's, and answered it 403 (the link was shown all the same)
            assert 'href="/ui/operator"' not in read_only.get(ws).text
            assert read_only.get("/ui/operator").status_code == 403
            assert 'href="/ui/operator"' in web.get(ws).text  # a token of every workspace has it
            # no Revert button for a read token (a button a 403 would answer), but the page says why
            assert "Revert this revision" not in read_only.get(f"{ws}/revisions/{revisions['move']}").text
            confirm = read_only.get(revert).text
            assert 'id="confirm-revert"' not in confirm and "reverting needs write" in confirm
            read_token = read_only.cookies.get("kb_csrf")  # the anti-forgery token every page sets
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
        assert log["message"].startswith('Revert "move the install guide"') and log["parent_id"] == revisions["move"]
        assert log["committer"].startswith("ui-writer <kb-token-")  # the token that reverted
        top = web.get(done.headers["location"]).text
        assert top.index(log["id"][:12]) < top.index(revisions["move"][:12])

        # the OpenAPI page loads Swagger UI from this server
        docs = web.get("/docs").text
        assert outside_urls(docs) == []
        for asset in re.findall(r'(?:src|href)="(/docs-assets/[^"]+)"', docs):
            assert web.get(asset).status_code == 200, asset


def _browser(webdriver):
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,800"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    return webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=CHROMEDRIVER))


def _by_and_keys():
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    return By, Keys


def _requested_urls(browser) -> list[str]:
    urls = []
    for entry in browser.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


@pytest.mark.skipif(
    CHROMEDRIVER is None or shutil.which("chromium") is None,
    reason="needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver; .ci/run does)",
)
def test_review_revert_and_retry_in_a_browser(served):
    webdriver = pytest.importorskip("selenium.webdriver", reason="the browser test needs selenium (the test extra)")
    url, revisions, tokens = served
    token = tokens["reviewer"]
    browser = _browser(webdriver)
    try:
        browser.implicitly_wait(10)
        browser.get(f"{url}/ui")  # no token yet: the login page
        By, Keys = _by_and_keys()
        browser.find_element(By.ID, "token").send_keys(token, Keys.ENTER)
        browser.find_element(By.LINK_TEXT, f"Workspace {WORKSPACE}").click()
        assert browser.find_element(By.TAG_NAME, "h1").text == f"Workspace {WORKSPACE}"

        # search from the workspace page with the keyboard, open the first result at its lines
        box = browser.find_element(By.ID, "q-top")
        box.send_keys("annual subscription refunded", Keys.ENTER)
        browser.find_element(By.CSS_SELECTOR, ".hits li h2 a").click()
        assert "/documents/Billing/Refunds.md?lines=" in browser.current_url
        marked = browser.find_elements(By.CSS_SELECTOR, "tr.marked")
        assert marked and any("within 60 days" in row.text for row in marked)

        # the line's last change is the agent's edit: open it and see the diff
        line = next(row for row in marked if "within 60 days" in row.text)
        line.find_element(By.CSS_SELECTOR, "td.blame a").click()
        assert revisions["edit"][:12] in browser.find_element(By.TAG_NAME, "h1").text
        assert "agent-7" in browser.page_source
        assert "within 60 days" in browser.find_element(By.CSS_SELECTOR, "tr.added").text
        assert "within 30 days" in browser.find_element(By.CSS_SELECTOR, "tr.removed").text

        # revert it (a confirmation page, then the button) and see the new revision at the top
        browser.find_element(By.PARTIAL_LINK_TEXT, "Revert this revision").click()
        browser.find_element(By.ID, "confirm-revert").click()
        top = browser.find_element(By.CSS_SELECTOR, "#revisions li:first-child")
        assert 'Revert "refunds: 60 days"' in top.text
        assert "is at the top" in browser.find_element(By.CSS_SELECTOR, ".notice").text

        # the operator's view shows the quarantined document; retrying it clears it
        browser.get(f"{url}/ui/operator")
        row = browser.find_element(By.CSS_SELECTOR, "#failed tbody tr")
        assert "/documents/Broken.md" in row.text and "quarantined" in row.text
        row.find_element(By.TAG_NAME, "button").click()
        assert "1 document queued" in browser.find_element(By.CSS_SELECTOR, ".notice").text

        browser.implicitly_wait(0)  # from here on an absent element is an answer, not a wait

        def cleared() -> bool:
            browser.get(f"{url}/ui/operator")
            return bool(browser.find_elements(By.ID, "no-failed"))

        wait_until(cleared, 60, "the retried document to be indexed")
        outside = [u for u in _requested_urls(browser) if not u.startswith((url, "data:"))]
        assert outside == []
    finally:
        browser.quit()


def test_one_token_gets_its_share_of_the_event_streams(served):
    """A read token opens as many live-update streams as the server keeps in all: it gets its
    share, the rest are refused with 429 saying what to do, and another token's page still gets
    its stream; the share comes back once the token's streams end (design §16, §17)."""
    from kb.adapters.http.ui.events import MAX_STREAMS, MAX_STREAMS_PER_TOKEN

    url, _, tokens = served
    events = f"/ui/workspaces/{WORKSPACE}/events"
    streamer = {"Authorization": f"Bearer {tokens['streamer']}"}
    with httpx.Client(base_url=url, timeout=60) as web:
        with contextlib.ExitStack() as held:
            answers = []
            for _ in range(MAX_STREAMS):
                stream = held.enter_context(web.stream("GET", events, headers=streamer))
                answers.append((stream.status_code, "" if stream.status_code == 200 else stream.read().decode()))
            assert [status for status, _ in answers] == [200] * MAX_STREAMS_PER_TOKEN + [429] * (
                MAX_STREAMS - MAX_STREAMS_PER_TOKEN
            ), answers
            refused = json.loads(answers[-1][1])
            assert refused["error"] == "TooManyStreams" and "close a tab" in refused["message"], refused
            other = {"Authorization": f"Bearer {tokens['reader']}"}
            with web.stream("GET", events, headers=other) as theirs:
                assert theirs.status_code == 200 and next(theirs.iter_text()).startswith("retry:")

        def share_back() -> bool:
            with web.stream("GET", events, headers=streamer) as again:
                return again.status_code == 200

        wait_until(share_back, 60, "the token's closed streams to give their slots back")


def test_a_stream_whose_client_left_before_it_began_gives_its_slot_back(served):
    """A client that asks for a page's event stream and hangs up before the answer begins (a tab
    closed at once) holds no slot: the token's share is there for its next page. Such a stream's
    slot (and its Postgres session) was never given back, and a few of them left the token without
    live updates until the server restarted (design §16, §17)."""
    import socket
    from urllib.parse import urlsplit

    from kb.adapters.http.ui.events import MAX_STREAMS_PER_TOKEN

    url, _, tokens = served
    where = urlsplit(url)
    events = f"/ui/workspaces/{WORKSPACE}/events"
    request = (
        f"GET {events} HTTP/1.1\r\nHost: {where.netloc}\r\nAuthorization: Bearer {tokens['quitter']}\r\n\r\n"
    ).encode()
    for _ in range(MAX_STREAMS_PER_TOKEN * 2):
        with socket.create_connection((where.hostname, where.port)) as hung_up:
            hung_up.sendall(request)  # and gone before any answer

    def share_back() -> bool:
        with httpx.Client(base_url=url, timeout=60) as web:
            with web.stream("GET", events, headers={"Authorization": f"Bearer {tokens['quitter']}"}) as again:
                return again.status_code == 200

    wait_until(share_back, 60, "the hung-up streams to give their slots back")


def test_document_page_blames_the_text_it_shows_while_a_writer_lands(kb, settings, monkeypatch):
    """design §17: the document page read the document, then blamed HEAD apart; a revision
    landing in between (forced here, by a real writer) gave it the blame of another text — a
    shorter one left lines without a blame row and the page failed (500). The page now shows the
    text its blame is of."""
    from fastapi.testclient import TestClient

    from kb.adapters.http.server import create_app
    from kb.knowledge_base import KnowledgeBase

    kb.create_workspace(1)
    with kb.transaction(1, "first", "ann") as tx:
        tx.write("/documents/a.md", "alpha\nbeta\ngamma\n")
    blame = KnowledgeBase.blame

    def blame_after_a_writer(self, workspace_id, path):
        monkeypatch.setattr(KnowledgeBase, "blame", blame)
        with kb.transaction(1, "second", "bob") as tx:  # a concurrent writer, run for real
            tx.write("/documents/a.md", "delta\n")
        return blame(self, workspace_id, path)

    monkeypatch.setattr(KnowledgeBase, "blame", blame_after_a_writer)
    with TestClient(create_app(settings, insecure_no_auth=True)) as client:
        page = client.get("/ui/workspaces/1/documents/a.md")
    assert page.status_code == 200, page.text
    assert "delta" in page.text and "gamma" not in page.text and "bob" in page.text
