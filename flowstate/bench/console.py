"""``flowstate bench console``: what a large session costs the console — the session route's full answer (its
first load, and what every poll paid before polls sent ``If-None-Match``) against a poll's 304, side by side in one
run, and, where Chromium and Selenium are installed, how long the console takes to open it (until its graph is drawn).

One session of ``requests`` requests with ``states`` states each (one raw observation a request that the first state
cites; each state follows the one before) is persisted into a fresh SQLite file the way the loop persists, then a
real ``flowstate serve`` (the scripted engine) answers the timed reads.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flowstate.bench.server import output, serve, stop
from flowstate.bench.table import table
from flowstate.nodes import Node, Ref, Relation, StateType
from flowstate.store.repository import Repository
from flowstate.store.tenants import legacy_tenant

KEY = "bench-console-key"
SESSION = "big"


def request_nodes(k: int, states: int) -> list[Node]:
    obs = f"obs_{k}"
    out = [Node(id=obs, kind="observation", type=StateType.KNOWLEDGE, summary=f"search(city=\"c{k}\")", request=k,
                value={"tool": "search", "arguments": {"city": f"c{k}"}, "result": {"hotels": [f"h{k}_0"]}})]
    for i in range(states):
        refs = [Ref(rel=Relation.SUPPORTS, state_id=obs)] if i == 0 else [Ref(rel=Relation.FOLLOWS,
                                                                              state_id=f"s{k}_{i - 1}")]
        out.append(Node(id=f"s{k}_{i}", type=StateType.JUDGEMENT, summary=f"hotel {i} in c{k} is the cheapest one",
                        value={"hotel": f"h{k}_{i}", "price": 100 + i}, refs=tuple(refs), request=k))
    return out


def _median_ms(call: Callable[[], Any], n: int) -> float:
    times = []
    for _ in range(n):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return round(1000 * statistics.median(times), 1)


def chromium() -> tuple[Any | None, str]:
    """A headless Chromium driven by Selenium (Debian's chromium and chromium-driver), or None and why not — the one
    place the console's browser is made (its tests use it too)."""
    binary, driver = shutil.which("chromium") or shutil.which("chromium-browser"), shutil.which("chromedriver")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError as exc:
        return None, f"selenium is not installed ({exc}): pip install -e '.[test]'"
    if not (binary and driver):
        return None, "chromium and chromedriver are not on PATH: apt-get install chromium chromium-driver"
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(arg)
    return webdriver.Chrome(options=options, service=Service(driver)), ""


def _browser_figures(root: str, last: str, timeout_s: float = 120) -> dict[str, Any]:
    """In a real Chromium: seconds from asking the console for the session to its graph being in the page, the
    states it drew then (only those in view are), and seconds to find the state ``last`` by its id (typed, the view
    scrolled to it and it selected) and to zoom out to a quarter; "no browser" without one."""
    browser, _ = chromium()
    if browser is None:
        return dict.fromkeys(BROWSER, "no browser")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, timeout_s)

    def timed(act: Callable[[], Any], css: str, text: str | None = None) -> float:
        started = time.perf_counter()
        act()
        wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, css)) if text is None
                   else ec.text_to_be_present_in_element((By.CSS_SELECTOR, css), text))
        return round(time.perf_counter() - started, 2)

    try:
        browser.get(root + "/ui/")
        browser.execute_script("sessionStorage.setItem('flowstate.console.key', arguments[0])", KEY)
        opened = timed(lambda: browser.get(root + f"/ui/#/session/{SESSION}"), "#state-graph .node")
        drawn = len(browser.find_elements(By.CSS_SELECTOR, "#state-graph .node"))

        def find() -> None:
            browser.find_element(By.ID, "graph-find-id").send_keys(last)
            browser.find_element(By.CSS_SELECTOR, "#graph-find button").click()

        found = timed(find, f"#state-graph .node.selected[data-id='{last}']")
        zoom = browser.find_element(By.ID, "zoom-out")
        zoomed = timed(lambda: [zoom.click() for _ in range(3)], "#graph-zoom", "25%")
        return {"console_open_s": opened, "drawn_states": drawn, "find_s": found, "zoom_out_s": zoomed}
    finally:
        browser.quit()


def bench_console(requests: int, states: int, polls: int, progress: Callable[[str], None]) -> dict[str, Any]:
    import httpx

    with tempfile.TemporaryDirectory() as tmp:
        db = str(Path(tmp) / "console.db")
        with Repository.open(db) as repo:
            repo.tenants.adopt(KEY)
            name = legacy_tenant(KEY) + "/" + SESSION
            for k in range(1, requests + 1):
                repo.persist_request(name, k, f"find the cheapest hotel in c{k}", f"h{k}_0", request_nodes(k, states),
                                     {"steps": []})
        progress(f"persisted {requests} requests, {requests * states} states")
        proc, url = serve(Path(tmp), [output(assistant_message={"content": "unused"})], db, ["--api-key", KEY])
        try:
            headers = {"Authorization": f"Bearer {KEY}"}
            route = f"{url}/v1/sessions/{SESSION}?layout=true"
            first = httpx.get(route, headers=headers, timeout=600)
            first.raise_for_status()
            tag = first.headers["etag"]
            full_ms = _median_ms(lambda: httpx.get(route, headers=headers, timeout=600).raise_for_status(),
                                 max(3, polls // 4))
            unchanged = httpx.get(route, headers={**headers, "If-None-Match": tag}, timeout=600)
            assert unchanged.status_code == 304, unchanged.status_code
            poll_ms = _median_ms(lambda: httpx.get(route, headers={**headers, "If-None-Match": tag}, timeout=600),
                                 polls)
            progress("timed the route; opening the console")
            browser = _browser_figures(url, f"s{requests}_{states - 1}")
        finally:
            stop(proc)
    return {"requests": requests, "states": requests * states, "answer_mb": round(len(first.content) / 2**20, 2),
            "full_read_ms": full_ms, "poll_304_ms": poll_ms, "poll_speedup": round(full_ms / max(poll_ms, 0.01), 1),
            **browser}


BROWSER = ["console_open_s", "drawn_states", "find_s", "zoom_out_s"]
HEAD = ["requests", "states", "answer_mb", "full_read_ms", "poll_304_ms", "poll_speedup", *BROWSER]


def render_table(row: dict[str, Any]) -> str:
    return table(HEAD, [row])
