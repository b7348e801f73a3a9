"""The console's state graph on a session too large to draw at once, in a real Chromium against a real server: only
what is in view is drawn; a state is found by its id (the view goes to it and selects it); filters by type,
relation and request hide what they name; zoom and a drag of the background move the view; and a live update keeps
all of it. Screenshots as in test_console.py."""

from __future__ import annotations

import re
from typing import Any

from flowstate import Repository
from flowstate.bench.console import request_nodes
from tests.serving.conftest import Server
from tests.serving.test_console import browser, shots, wait_for, wait_until

__all__ = ["browser", "shots"]  # the fixtures, used by name

REQUESTS, STATES = 60, 4  # 60 observations and 240 states: far more than a view holds


def persist(db: Any, k: int) -> None:
    with Repository.open(db) as repo:
        repo.persist_request("big", k, f"find the cheapest hotel in c{k}", f"h{k}_0", request_nodes(k, STATES),
                             {"steps": []})


def drawn(browser: Any, css: str = "") -> list[str]:
    from selenium.webdriver.common.by import By

    return [n.get_attribute("data-id") for n in browser.find_elements(By.CSS_SELECTOR, "#state-graph .node" + css)]


def js(browser: Any, expr: str) -> Any:
    return browser.execute_script("return " + expr)


def test_a_large_graph_is_drawn_in_view_found_filtered_zoomed_and_panned(server: Server, browser: Any,
                                                                        shots: Any) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    for k in range(1, REQUESTS + 1):
        persist(server.db, k)
    root = server.start([{"text": "unused"}]).removesuffix("/v1")
    browser.get(root + "/ui/#/session/big")
    wait_for(browser, "#state-graph .node[data-id='s1_0']", 30)
    total = REQUESTS * (STATES + 1)
    assert browser.find_element(By.ID, "graph-shown").text == f"{total} states"
    first = drawn(browser)
    assert 0 < len(first) < total / 4 and "s60_3" not in first  # what is in view, not the whole graph

    # find a state by id: the view goes there, the state is selected and its panel shown
    browser.find_element(By.ID, "graph-find-id").send_keys("s60_3")
    browser.find_element(By.CSS_SELECTOR, "#graph-find button").click()
    wait_for(browser, "#state-graph .node.selected[data-id='s60_3']")
    assert js(browser, "document.getElementById('graph-scroll').scrollLeft") > 1000
    assert "s60_3" in browser.find_element(By.ID, "state").text and "s1_0" not in drawn(browser)
    # a scroll redraws only what enters and leaves the view: the state with the focus keeps it
    browser.execute_script("document.querySelector(\"#state-graph .node[data-id='s60_3']\").focus();"
                           "document.getElementById('graph-scroll').scrollLeft -= 40")
    browser.execute_async_script("requestAnimationFrame(() => requestAnimationFrame(arguments[0]))")  # drawn again
    assert js(browser, "document.activeElement.dataset.id") == "s60_3"
    box = browser.find_element(By.ID, "graph-find-id")
    box.clear()
    box.send_keys("s59_")
    browser.find_element(By.CSS_SELECTOR, "#graph-find button").click()
    wait_until(browser, lambda: "No state s59_ in this session." in browser.find_element(By.ID, "graph-find-note").text)
    assert "s59_0" in browser.find_element(By.ID, "graph-find-note").text  # ids like it, to pick from
    shots(browser, "graph-found")

    # filters: a type, a relation, a range of requests
    browser.find_element(By.ID, "graph-observation").click()
    wait_until(browser, lambda: browser.find_element(By.ID, "graph-shown").text == f"showing 240 of {total}")
    assert drawn(browser) and not drawn(browser, "[data-type='observation']")
    browser.find_element(By.ID, "graph-observation").click()
    wait_until(browser, lambda: drawn(browser, "[data-type='observation']"))

    def rels() -> set[str]:
        return {e.get_attribute("data-rel") for e in browser.find_elements(By.CSS_SELECTOR, "#state-graph .edge")}

    assert rels() == {"supports", "follows"}
    browser.find_element(By.ID, "graph-follows").click()
    wait_until(browser, lambda: rels() == {"supports"})
    for which, value in (("graph-from", "30"), ("graph-to", "31")):
        field = browser.find_element(By.ID, which)
        field.send_keys(value)
        field.send_keys("\t")  # a change
    wait_until(browser, lambda: browser.find_element(By.ID, "graph-shown").text == f"showing 10 of {total}")
    assert {re.findall(r"\d+", i)[0] for i in drawn(browser)} == {"30", "31"}

    # zoom out to a quarter: the drawing a quarter the size
    width = int(browser.find_element(By.ID, "state-graph").get_attribute("width"))
    for _ in range(3):
        browser.find_element(By.ID, "zoom-out").click()
    wait_until(browser, lambda: browser.find_element(By.ID, "graph-zoom").text == "25%")
    assert abs(int(browser.find_element(By.ID, "state-graph").get_attribute("width")) - width / 4) <= 1
    browser.find_element(By.ID, "graph-to").clear()
    browser.find_element(By.ID, "graph-to").send_keys("\t")
    wait_until(browser, lambda: len(drawn(browser)) > len(first))  # a quarter the size: more in view
    shots(browser, "graph-zoomed")

    # a drag of the background pans
    before = js(browser, "document.getElementById('graph-scroll').scrollLeft")
    svg = browser.find_element(By.ID, "state-graph")
    ActionChains(browser).move_to_element_with_offset(svg, 0, svg.size["height"] // 2 - 3).click_and_hold() \
        .move_by_offset(-150, 0).release().perform()
    wait_until(browser, lambda: js(browser, "document.getElementById('graph-scroll').scrollLeft") > before + 100)

    # a live update (a request finishing) redraws the page and keeps the view as it was set
    persist(server.db, REQUESTS + 1)
    wait_for(browser, "#request-61", 15)
    assert browser.find_element(By.ID, "graph-zoom").text == "25%"
    assert not browser.find_element(By.ID, "graph-follows").is_selected()
    assert browser.find_element(By.ID, "graph-from").get_attribute("value") == "30"
    assert rels() == {"supports"} and not drawn(browser, "[data-id^='s29_']")
