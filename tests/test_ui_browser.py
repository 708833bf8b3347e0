"""design §17, the acceptance path in a real headless browser (Debian's chromium and chromedriver,
driven by selenium; nothing is downloaded) against a real ``kb serve``: open a workspace, search,
open a result at its lines, open the revision that last changed them, see the diff, revert it and
see the new revision at the top, after logging in with a token; the operator's view shows a quarantined document and retrying it
clears it. The browser's network log shows no request leaving the server."""

from __future__ import annotations

import json
import shutil

import pytest
from support.kb_server import running_server
from support.ui_pages import WORKSPACE, make_token, make_workspace
from support.waiting import wait_until

webdriver = pytest.importorskip("selenium.webdriver", reason="the browser test needs selenium (the test extra)")
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402

CHROMEDRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    CHROMEDRIVER is None or shutil.which("chromium") is None,
    reason="needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver; .ci/run does)",
)


def _browser():
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,800"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    return webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=CHROMEDRIVER))


def _requested_urls(browser) -> list[str]:
    urls = []
    for entry in browser.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


def test_review_revert_and_retry_in_a_browser(settings, kb_env, tmp_path):
    revisions = make_workspace(settings, tmp_path / "notes")
    token = make_token(settings, "reviewer", "write")
    with running_server(kb_env, tmp_path / "serve.log") as url:
        browser = _browser()
        try:
            browser.implicitly_wait(10)
            browser.get(f"{url}/ui")  # no token yet: the login page
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
