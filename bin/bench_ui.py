#!/usr/bin/env python
"""The pages' latency at scale (design §17): p50/p95 of each page under ``/ui`` for a workspace of
the ~6,600 tldr pages, against the JSON API call that returns the same data (the reference), with
the ratio; optionally screenshots of each page at 1280×800 in Debian's headless chromium.

Set-up (kept under --work between runs): the tldr pages imported as workspace 1 and indexed with
the hashing embedder (search latency does not depend on what the vectors mean; say so with the
figures), then three revisions to show: an agent's edit with a ``Turn:`` trailer, a move, and a
document the model rejects; a chat's citation handle. Then ``kb serve --with-worker`` with a write
token, and per round every page and its reference once each, interleaved (pages in a shuffled
order), timed from request to the last byte with one keep-alive HTTP client.

Usage: python bin/bench_ui.py [--corpus DIR] [--rounds 30] [--screens DIR] [--work /tmp/kb-bench-ui]
The corpus defaults to shared/corpus/tldr/pages beside the repository. Uses an embedded Postgres
under --work unless KB_DATABASE_URL is set. Prints the table and writes bench-results/ui-<time>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from support.network import free_port  # noqa: E402

from kb.knowledge_base import KnowledgeBase  # noqa: E402
from kb.settings import Settings  # noqa: E402

WS = 1
EDITED = "/documents/common/tar.md"
MOVED = ("/documents/common/zip.md", "/documents/common/archives/zip.md")


def prepare(settings: Settings, corpus: Path) -> dict:
    """Import and index the corpus once (kept under --work); returns the revisions and paths to show."""
    kb = KnowledgeBase.open(settings)
    kb.create_workspace(WS)
    if kb.head(WS) is None:
        started = time.perf_counter()
        kb.import_folder(corpus, WS, message="import the tldr pages")
        text = kb.read(WS, EDITED).decode()
        agent = kb.turn(WS, "bench-agent-1", author="agent")  # its commit writes the trailer Turn: bench-agent-1
        agent.write(EDITED, text.replace("\n", "\n\n- Note: `-z` filters the archive through gzip.\n", 1))
        agent.commit("tar: say what -z does")
        with kb.transaction(WS, "file the zip page under archives", "bob") as tx:
            tx.move(*MOVED)
        kb.run_worker(until_idle=True)
        print(f"imported and indexed {len(kb.list_paths(WS))} documents in {time.perf_counter() - started:.0f} s")
    history = kb.history(WS, None, 10)
    edit = next(r for r in history if r.message.startswith("tar:"))
    chat = kb.conversation(WS, "bench-chat")
    chat.forget()
    hit = chat.search("extract a tar archive", 1)[0]
    lines = [n for n, _ in hit.lines if n is not None]
    token = kb.tokens().create(f"bench-ui-{os.getpid()}", "write", None, None)[1]
    kb.close()
    return {
        "edit": edit.id,
        "citation": f"[{hit.cite}:L{lines[0]}-L{lines[-1]}]" if lines else f"[{hit.cite}]",
        "token": token,
    }


def pages(shown: dict) -> list[tuple[str, str, str | None]]:
    """(name, page URL, reference API URL or None)."""
    ws = f"/ui/workspaces/{WS}"
    doc = quote(EDITED.removeprefix("/documents/"))
    cite = quote(shown["citation"])
    return [
        ("workspaces", "/ui", None),
        ("workspace", ws, f"/v1/status?workspace={WS}"),
        ("folder (common, ~2,800 entries)", f"{ws}/folders/common", None),
        ("document + blame", f"{ws}/documents/{doc}?lines=3-4", f"/v1/workspaces/{WS}/documents/documents/{doc}"),
        ("revision + diff", f"{ws}/revisions/{shown['edit']}", None),
        ("search", f"{ws}/search?q=extract+a+tar+archive", f"/v1/workspaces/{WS}/search?q=extract+a+tar+archive&k=10"),
        (
            "citation + follow",
            f"{ws}/citation?chat=bench-chat&c={cite}",
            f"/v1/workspaces/{WS}/chats/bench-chat/resolve?citation={cite}&follow=true",
        ),
        ("operator", "/ui/operator", "/v1/status"),
    ]


def timed(client: httpx.Client, url: str) -> float:
    started = time.perf_counter()
    answer = client.get(url)
    elapsed = time.perf_counter() - started
    if answer.status_code != 200:
        raise SystemExit(f"{url} answered {answer.status_code}: {answer.text[:300]}")
    return elapsed * 1000


def screenshots(base: str, token: str, shown: dict, folder: Path) -> None:
    """Each page at 1280×800 in headless chromium (logged in through the login page)."""
    from selenium import webdriver
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    folder.mkdir(parents=True, exist_ok=True)
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,800"):
        options.add_argument(argument)
    browser = webdriver.Chrome(options=options, service=webdriver.ChromeService(shutil.which("chromedriver")))
    try:
        browser.get(f"{base}/ui/login")
        browser.save_screenshot(str(folder / "00-login.png"))
        browser.find_element(By.ID, "token").send_keys(token, Keys.ENTER)
        extra = [
            ("revert-confirm", f"/ui/workspaces/{WS}/revisions/{shown['edit']}/revert"),
            ("docs", "/docs"),
        ]
        for i, (name, url) in enumerate([(n, u) for n, u, _ in pages(shown)] + extra, start=1):
            browser.get(base + url)
            time.sleep(1.0 if name == "docs" else 0.2)
            slug = name.split(" ")[0]
            browser.save_screenshot(str(folder / f"{i:02d}-{slug}.png"))
        browser.set_window_size(420, 800)  # a narrow window
        browser.get(f"{base}/ui/workspaces/{WS}/documents/{quote(EDITED.removeprefix('/documents/'))}?lines=3-4")
        browser.save_screenshot(str(folder / "20-document-narrow.png"))
    finally:
        browser.quit()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", type=Path, default=ROOT.parent / "shared" / "corpus" / "tldr" / "pages")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--screens", type=Path, default=None)
    parser.add_argument("--work", type=Path, default=Path("/tmp/kb-bench-ui"))
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if k.startswith("KB_DATABASE_URL") or not k.startswith("KB_")}
    env.update(KB_STORAGE_ROOT=str(args.work / "storage"), KB_EMBEDDING_MODEL="hashing")
    settings = Settings(
        storage_root=args.work / "storage",
        embedding_model="hashing",
        database_url=env.get("KB_DATABASE_URL"),
    )
    shown = prepare(settings, args.corpus)
    port = free_port()
    log = (args.work / "serve.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "kb.adapters.cli", "serve", "--with-worker", "--port", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{base}/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                raise SystemExit(f"kb serve did not start; see {args.work / 'serve.log'}")
            time.sleep(0.2)
        headers = {"Authorization": f"Bearer {shown['token']}"}
        figures: dict[str, dict[str, list[float]]] = {}
        with httpx.Client(base_url=base, headers=headers, timeout=120) as client:
            targets = pages(shown)
            for _, page, api in targets:  # warm-up: caches, the pool, the templates
                timed(client, page)
                if api:
                    timed(client, api)
            for _ in range(args.rounds):
                for name, page, api in random.sample(targets, len(targets)):
                    legs = [("page", page), ("api", api)] if api else [("page", page)]
                    for leg, url in random.sample(legs, len(legs)):
                        figures.setdefault(name, {}).setdefault(leg, []).append(timed(client, url))
        load = os.getloadavg()
        print(f"\n{args.rounds} rounds, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, {os.cpu_count()} cores")
        print(f"{'page':34} {'p50 ms':>8} {'p95 ms':>8} {'API p50':>8} {'ratio':>6}")
        result = {}
        for name, _, _ in pages(shown):
            legs = figures[name]
            p50 = statistics.median(legs["page"])
            p95 = statistics.quantiles(legs["page"], n=20)[-1]
            api50 = statistics.median(legs["api"]) if "api" in legs else None
            ratio = f"{p50 / api50:6.2f}" if api50 else "     —"
            api_text = f"{api50:8.1f}" if api50 else "       —"
            print(f"{name:34} {p50:8.1f} {p95:8.1f} {api_text} {ratio}")
            result[name] = {"p50_ms": p50, "p95_ms": p95, "api_p50_ms": api50}
        out = ROOT / "bench-results"
        out.mkdir(exist_ok=True)
        (out / f"ui-{time.strftime('%Y%m%dT%H%M%S')}.json").write_text(
            json.dumps({"load": load, "pages": result}, indent=2)
        )
        if args.screens:
            screenshots(base, shown["token"], shown, args.screens)
            print(f"screenshots in {args.screens}")
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=120)


if __name__ == "__main__":
    main()
