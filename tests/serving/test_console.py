"""The console in a real Chromium (Debian's chromium and chromium-driver, driven by Selenium) against a real server on
both databases: sign in, the key's sessions, a session's states and a rejected operation, following a relation,
search landing on its hit, deleting a session; values from the model shown as text; a running turn appearing
without a reload. Each page's screenshot goes to ``$FLOWSTATE_ARTIFACTS`` (CI keeps them) or the test's folder."""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from flowstate import Repository
from flowstate.bench.console import chromium
from flowstate.store.quotas import Quota
from flowstate.store.tenants import legacy_tenant
from tests.helpers import add, output
from tests.serving.conftest import Server, lines
from tests.serving.test_chat import client
from tests.serving.test_memory_api import trip

REQUIRE_ENV = "FLOWSTATE_REQUIRE_BROWSER"  # CI sets it: no browser is then a failure, not a skip
ARTIFACTS_ENV = "FLOWSTATE_ARTIFACTS"
XSS = '<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>'


def _browser() -> Any:
    browser, reason = chromium()
    if browser is not None:
        return browser
    if os.environ.get(REQUIRE_ENV):
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    b = _browser()
    b.set_script_timeout(10)
    yield b
    b.quit()


@pytest.fixture
def shots(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    folder = Path(os.environ.get(ARTIFACTS_ENV) or tmp_path) / "console"
    folder.mkdir(parents=True, exist_ok=True)

    def shot(browser: Any, name: str) -> Path:
        path = folder / f"{request.node.callspec.id if hasattr(request.node, 'callspec') else 'run'}-{name}.png"
        browser.save_screenshot(str(path))
        assert path.stat().st_size > 1000
        return path

    return shot


def script() -> list[dict[str, Any]]:
    out = trip()
    evil = add("kn_evil", note=XSS)
    evil["summary"] = XSS
    out += lines("[evil]", [output(delta=[evil], content=XSS)])
    out += lines("[spare]", [output(content="spare")])
    return out


def wait_for(browser: Any, css: str, timeout: float = 10) -> Any:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(browser, timeout).until(ec.presence_of_element_located((By.CSS_SELECTOR, css)))


def wait_until(browser: Any, check: Any, timeout: float = 10) -> Any:
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    # a page re-renders while it is read (a route change, a poll): what was found may be gone, or not there yet
    return WebDriverWait(browser, timeout, ignored_exceptions=(NoSuchElementException, StaleElementReferenceException)
                         ).until(lambda _: check())


@pytest.mark.parametrize("db", ["sqlite", "postgres"])
def test_the_console_as_an_operator_uses_it(db: str, server: Server, browser: Any, shots: Any,
                                            request: pytest.FixtureRequest) -> None:
    from selenium.webdriver.common.by import By

    if db == "postgres":
        server.db = request.getfixturevalue("pg_server").new_database()  # type: ignore[assignment]
    url = server.start(script(), "--api-key", "key-one", "--api-key", "key-two", "--metrics-key", "metrics-key")
    for user, text in (("trip", "[trip] a quiet hotel in Lisbon"), ("evil-1", "[evil] " + XSS), ("spare", "[spare] x")):
        client(url, "key-one").chat.completions.create(model="flowstate", user=user,
                                                       messages=[{"role": "user", "content": text}])
    with Repository.open(server.db) as repo:  # a limit for key-one's tenant (the static key's, adopted at start)
        repo.quotas.set_quota(legacy_tenant("key-one"), Quota(requests_per_minute=600))
    root = url.removesuffix("/v1")
    browser.get(root + "/ui/")
    browser.execute_script("sessionStorage.clear()")
    browser.get(root + "/ui/#/")

    wait_for(browser, "#sign-in")  # a key is needed: the sign-in form, one password field
    wait_until(browser, lambda: browser.find_element(By.CSS_SELECTOR, "#sign-in #api-key").get_attribute("type")
               == "password")  # read again: the page may render the form twice as it starts
    shots(browser, "sign-in")
    for wrong in ("wrong", "metrics-key"):  # /metrics' key opens nothing
        field = browser.find_element(By.ID, "api-key")
        field.clear()
        field.send_keys(wrong)
        browser.find_element(By.CSS_SELECTOR, "#sign-in button[type=submit]").click()
        wait_until(browser, lambda: "not one this server takes" in browser.find_element(By.ID, "sign-in-error").text)
    field = browser.find_element(By.ID, "api-key")
    field.clear()
    field.send_keys("key-one")
    browser.find_element(By.CSS_SELECTOR, "#sign-in button[type=submit]").click()

    table = wait_for(browser, "#sessions")
    names = [a.text for a in table.find_elements(By.CSS_SELECTOR, ".session-link")]
    assert names == ["spare", "evil-1", "trip"]  # newest activity first
    assert "key-one" not in browser.current_url
    usage = browser.find_element(By.ID, "quota").text  # the signed-in tenant's usage against its quota
    assert "Requests this minute: 0 / 600" in usage and "Running turns: 0 / no limit" in usage, usage
    assert re.search(r"Model tokens today \(UTC\): [\d,]+ / no limit", usage) and "tokens today (UTC): 0 " not in usage
    shots(browser, "sessions")

    table.find_element(By.LINK_TEXT, "trip").click()
    wait_for(browser, "#state-graph .node[data-id='dec_hotel']")
    assert browser.find_element(By.ID, "session-name").text == "trip"
    kinds = {n.get_attribute("data-id"): n.get_attribute("data-type")
             for n in browser.find_elements(By.CSS_SELECTOR, "#state-graph .node")}
    assert kinds == {"pref_quiet": "preference", "dec_hotel": "judgement"}
    whole = client(url, "key-one").get("/sessions/trip", cast_to=object)["nodes"]
    summary = next(n["summary"] for n in whole if n["id"] == "dec_hotel")
    from selenium.webdriver.common.action_chains import ActionChains

    ActionChains(browser).move_to_element(browser.find_element(By.ID, "session-name")).perform()  # off the graph
    wait_until(browser, lambda: not browser.find_element(By.ID, "graph-tip").is_displayed())
    browser.execute_script("document.querySelector(\"#state-graph .node[data-id='dec_hotel']\").focus()")
    wait_until(browser, lambda: browser.find_element(By.ID, "graph-tip").is_displayed())
    assert browser.find_element(By.ID, "graph-tip").text == "dec_hotel " + summary  # whole, on focus
    browser.execute_script("document.activeElement.blur()")
    wait_until(browser, lambda: not browser.find_element(By.ID, "graph-tip").is_displayed())
    assert [e.get_attribute("data-rel")
            for e in browser.find_elements(By.CSS_SELECTOR, "#state-graph .edge")] == ["supports"]
    # one layout: the console draws each node and arrow where the server's graph page does
    page = httpx.get(url + "/sessions/trip/graph", headers={"Authorization": "Bearer key-one"}).text
    drawn = {n.get_attribute("data-id"): [n.find_element(By.TAG_NAME, "rect").get_attribute(a) for a in ("x", "y")]
             for n in browser.find_elements(By.CSS_SELECTOR, "#state-graph .node")}
    placed = re.findall(r'data-id="([^"]+)"[^>]*><title>[^<]*</title><rect x="([^"]+)" y="([^"]+)"', page)
    assert drawn == {i: [x, y] for i, x, y in placed} and len(placed) == 2, (drawn, placed)
    assert [e.get_attribute("d") for e in browser.find_elements(By.CSS_SELECTOR, "#state-graph .edge")] == \
        re.findall(r'<path class="edge" d="([^"]+)"', page)
    browser.find_element(By.CSS_SELECTOR, "#request-1 .steps-toggle").click()
    rejected = wait_for(browser, "#request-1 .op.rejected")
    assert "ghost" in rejected.text and "created in this request" in rejected.find_element(By.CLASS_NAME, "reason").text
    accepted = [op.text for op in browser.find_elements(By.CSS_SELECTOR, "#request-1 .op.accepted")]
    assert len(accepted) == 2 and "pref_quiet" in accepted[0]
    assert "prompt" in browser.find_element(By.CSS_SELECTOR, "#request-1 .usage").text

    browser.find_element(By.CSS_SELECTOR, "#state-graph .node[data-id='dec_hotel']").click()
    wait_until(browser, lambda: browser.find_element(By.ID, "state").get_attribute("data-state") == "dec_hotel")
    assert "Baixa" in browser.find_element(By.ID, "state-value").text
    shots(browser, "session")
    browser.find_element(By.CSS_SELECTOR, "#relations-out .state-link[data-target='pref_quiet']").click()  # follow it
    wait_until(browser, lambda: browser.find_element(By.ID, "state").get_attribute("data-state") == "pref_quiet")
    assert browser.find_element(By.ID, "state-id").text == "pref_quiet"
    assert "dec_hotel" in browser.find_element(By.ID, "relations-in").text
    assert "state=pref_quiet" in browser.current_url

    browser.find_element(By.ID, "nav-search").click()
    box = wait_for(browser, "#search-q")
    box.send_keys("quiet lisbon")
    browser.find_element(By.CSS_SELECTOR, "form.toolbar button[type=submit]").click()
    hit = wait_for(browser, "#hits .hit-link")
    assert [a.text for a in browser.find_elements(By.CSS_SELECTOR, "#hits .hit-link")] == ["pref_quiet"]
    shots(browser, "search")
    hit.click()
    wait_until(browser, lambda: browser.find_element(By.ID, "state").get_attribute("data-state") == "pref_quiet")
    assert browser.find_element(By.ID, "session-name").text == "trip"

    browser.get(root + "/ui/#/session/evil-1")  # what a model wrote is shown as text, on every page
    wait_for(browser, "#state-graph .node[data-id='kn_evil']").click()
    wait_until(browser, lambda: browser.find_element(By.ID, "state-summary").text == XSS)
    browser.find_element(By.CSS_SELECTOR, "#request-1 .steps-toggle").click()
    wait_for(browser, "#request-1 .step .answer")
    assert XSS in browser.find_element(By.CSS_SELECTOR, "#request-1 .response").text
    assert XSS in browser.find_element(By.CSS_SELECTOR, "#request-1 .query").text
    browser.get(root + "/ui/#/search?q=onerror")
    wait_for(browser, "#hits .hit")
    assert XSS in browser.find_element(By.CSS_SELECTOR, "#hits .summary").text
    assert browser.execute_script("return window.__pwned === undefined && document.querySelectorAll('main img, main "
                                  "script').length === 0")

    browser.get(root + "/ui/#/")
    row = wait_for(browser, "tr[data-session='spare']")
    row.find_element(By.CSS_SELECTOR, "button.delete").click()
    browser.switch_to.alert.dismiss()  # not confirmed: nothing deleted
    assert client(url, "key-one").get("/sessions/spare", cast_to=object)["id"] == "spare"
    row.find_element(By.CSS_SELECTOR, "button.delete").click()
    browser.switch_to.alert.accept()
    wait_until(browser, lambda: not browser.find_elements(By.CSS_SELECTOR, "tr[data-session='spare']"))
    assert client(url, "key-one").get("/sessions", cast_to=object)["data"][0]["id"] == "evil-1"

    browser.find_element(By.ID, "sign-out").click()  # the other key sees only its own (none)
    field = wait_for(browser, "#api-key")
    field.send_keys("key-two")
    browser.find_element(By.CSS_SELECTOR, "#sign-in button[type=submit]").click()
    wait_until(browser, lambda: "No sessions yet." in browser.find_element(By.ID, "main").text)
    browser.get(root + "/ui/#/session/trip")
    wait_until(browser, lambda: "no session" in browser.find_element(By.ID, "main").text.lower())
    assert browser.execute_script("return sessionStorage.length") == 1 and "key-two" not in browser.current_url


def test_a_running_turn_appears_and_settles(server: Server, browser: Any, shots: Any) -> None:
    """A server without keys opens without signing in; a turn started after the page loaded shows up while it runs
    and settles when it ends, with no reload."""
    from selenium.webdriver.common.by import By

    slow = [{"text": output(delta=[add("kn_first")], content="first"), "when": "[first]"},
            {"text": output(tools=[{"name": "wait", "arguments": {"seconds": 4}}]), "when": "[slow]"},
            {"text": output(delta=[add("kn_waited", waited=True)], content="done waiting"), "when": "[slow]"}]
    url = server.start(slow, "--tools", "tests.serving.slow_tools:TOOLS")
    api = client(url)
    api.chat.completions.create(model="flowstate", user="live", messages=[{"role": "user", "content": "[first] go"}])
    browser.get(url.removesuffix("/v1") + "/ui/#/session/live")
    browser.refresh()
    wait_for(browser, "#state-graph .node[data-id='kn_first']")
    turn = threading.Thread(target=lambda: api.chat.completions.create(
        model="flowstate", user="live", messages=[{"role": "user", "content": "[slow] wait"}]))
    turn.start()
    try:
        running = wait_for(browser, "#running", timeout=15)
        assert "[slow] wait" in running.text
        shots(browser, "running")
        wait_for(browser, "#state-graph .node[data-id='kn_waited']", timeout=30)
        # the request is stored a moment before the turn leaves the server's registry: a poll between the two shows
        # both, the next one the request settled
        wait_until(browser, lambda: not browser.find_elements(By.ID, "running"), 15)
        assert "done waiting" in browser.find_element(By.ID, "request-2").text
    finally:
        turn.join(30)


def test_a_chain_a_fork_tree_the_filter_and_pages(server: Server, browser: Any, shots: Any) -> None:
    """The hotel case's session (its judgement superseded in request 3), a fork of it, and enough sessions for two
    pages: the state's versions, the fork tree both ways, the name filter and the next page, in the browser."""
    from selenium.webdriver.common.by import By

    from engine.scripted import ScriptedEngine
    from flowstate import Agent, Repository
    from flowstate.demo import hotel
    from flowstate.nodes import Node, Ref, Relation, StateType

    with Repository.open(server.db) as repo:
        agent = Agent(ScriptedEngine.from_file(hotel.script_path()), repository=repo, session="hotel",
                      tools=hotel.TOOLS, task_policy=hotel.POLICY)
        for q in hotel.QUERIES:
            agent.run(q)
        repo.lineage.fork("hotel", 1, "hotel-b")
        repo.persist_request("hotel-b", 2, "Switch to B", "Switched.", [
            Node(id="dec_switch_b", type=StateType.JUDGEMENT, summary="Switch to B", value={"hotel": "B"},
                 refs=(Ref(rel=Relation.SUPERSEDES, state_id="dec_book_a"),), request=2)], {"steps": []})
        for i in range(55):
            repo.persist_request(f"bulk-{i:02d}", 1, "q", "a", [], {"steps": []})
    root = server.start([{"text": output(content="x")}]).removesuffix("/v1")

    browser.get(root + "/ui/#/session/hotel?state=dec_keep_a")
    chain = wait_for(browser, "#supersedes-chain")
    assert [li.text.split()[0] for li in chain.find_elements(By.TAG_NAME, "li")] == ["dec_book_a", "dec_keep_a"]
    tree = wait_for(browser, "#fork-tree")
    assert "hotel-b" in tree.text and "shares requests 1–1" in tree.text
    shots(browser, "chain-and-forks")
    tree.find_element(By.LINK_TEXT, "hotel-b").click()
    wait_until(browser, lambda: browser.find_element(By.ID, "session-name").text == "hotel-b")
    assert "hotel" in wait_for(browser, "#fork-tree").text  # the fork's tree names the session it shares
    assert wait_for(browser, "#state-graph .node[data-id='dec_book_a']")  # what it shares is in its graph

    browser.get(root + "/ui/#/")
    first = [a.text for a in wait_for(browser, "#sessions").find_elements(By.CSS_SELECTOR, ".session-link")]
    assert len(first) == 50 and first[0] == "bulk-54"
    browser.find_element(By.ID, "next-page").click()
    wait_until(browser, lambda: "bulk-04" in browser.find_element(By.ID, "sessions").text)
    rest = [a.text for a in browser.find_elements(By.CSS_SELECTOR, "#sessions .session-link")]
    assert set(rest).isdisjoint(first) and len(first) + len(rest) == 57
    browser.get(root + "/ui/#/")
    wait_until(browser, lambda: "bulk-54" in browser.find_element(By.ID, "sessions").text)  # the first page again
    box = browser.find_element(By.ID, "session-filter")
    box.send_keys("HOTEL")
    box.submit()
    wait_until(browser, lambda: len(browser.find_elements(By.CSS_SELECTOR, "#sessions .session-link")) == 2)
    assert {a.text for a in browser.find_elements(By.CSS_SELECTOR, "#sessions .session-link")} == {"hotel", "hotel-b"}


def test_a_redacting_servers_console_shows_placeholders_and_what_was_redacted(server: Server, browser: Any,
                                                                               shots: Any) -> None:
    """With --redact mask the console shows the request as stored — the placeholder, never the address — and, with
    its steps open, how many values of each kind were redacted."""
    from selenium.webdriver.common.by import By

    from flowstate.store.vault import new_key

    email = "mia.li3818@example.com"
    url = server.start([{"text": output(delta=[add("kn_contact", email=email)], content="noted"), "when": "[r]"}],
                       "--redact", "mask", "--vault-key", new_key())
    client(url).chat.completions.create(model="flowstate", user="private",
                                        messages=[{"role": "user", "content": f"[r] write to {email}"}])
    browser.get(url.removesuffix("/v1") + "/ui/#/session/private")
    browser.refresh()
    wait_for(browser, "#state-graph .node[data-id='kn_contact']")
    query = browser.find_element(By.CSS_SELECTOR, "#request-1 .query").text
    assert email not in query and re.search(r"\[EMAIL_[0-9a-f]{12}\]", query)
    browser.find_element(By.CSS_SELECTOR, "#request-1 .steps-toggle").click()
    counts = wait_for(browser, "#request-1 .redactions")
    assert re.fullmatch(r"Redacted before storing: \d+ email", counts.text) and email not in browser.page_source
    shots(browser, "redacted")


def test_feedback_given_on_a_request_shows_on_it(server: Server, browser: Any, shots: Any) -> None:
    """Feedback posted on a request (score, label, comment) shows under the request in the console, as text."""
    import httpx
    from selenium.webdriver.common.by import By

    url = server.start([{"text": output(content="booked"), "when": "[f]"}])
    client(url).chat.completions.create(model="flowstate", user="rated",
                                        messages=[{"role": "user", "content": "[f] book it"}])
    said = httpx.post(url + "/sessions/rated/requests/1/feedback", timeout=30,
                      json={"score": -1, "label": "wrong_date", "comment": "<b>the 11th</b>, not the 10th"})
    assert said.status_code == 200, said.text
    browser.get(url.removesuffix("/v1") + "/ui/#/session/rated")
    browser.refresh()
    item = wait_for(browser, "#request-1 .feedback li")
    assert "score -1" in item.text and "“wrong_date”" in item.text
    assert browser.find_element(By.CSS_SELECTOR,
                                "#request-1 .feedback .comment").text == "<b>the 11th</b>, not the 10th"
    shots(browser, "feedback")


def test_a_live_update_keeps_scroll_focus_and_what_is_open(server: Server, browser: Any, shots: Any) -> None:
    """A request finishing while the page is open updates it in place: the window's scroll, the focused control,
    the steps and the raw output opened, the text selected and the state panel stay as they were; the new request is
    there; the graph's states are buttons with accessible names."""
    from selenium.webdriver.common.by import By

    many = [{"text": output(delta=[add(f"kn_{i}", note="x" * 40) for i in range(6)], content="first " + "y" * 800),
             "when": "[one]"}, {"text": output(content="second"), "when": "[two]"}]
    url = server.start(many)
    api = client(url)
    api.chat.completions.create(model="flowstate", user="keep", messages=[{"role": "user", "content": "[one] go"}])
    browser.set_window_size(900, 500)
    try:
        browser.get(url.removesuffix("/v1") + "/ui/#/session/keep?state=kn_3")
        browser.refresh()
        node = wait_for(browser, "#state-graph .node[data-id='kn_3']")
        assert node.get_attribute("role") == "button" and node.get_attribute("aria-label").startswith("kn_3, knowledge")
        assert node.get_attribute("aria-pressed") == "true"
        browser.find_element(By.CSS_SELECTOR, "#request-1 .steps-toggle").click()
        raw = wait_for(browser, "#request-1 .step details")
        browser.execute_script("arguments[0].open = true; document.querySelector('#request-1 .steps-toggle').focus();"
                               "window.scrollTo(0, 400);", raw)
        selected = browser.execute_script(  # some of the first answer's text, selected as a reader would
            "const t = document.querySelector('#request-1 .response').firstChild;"
            "window.getSelection().setBaseAndExtent(t, 2, t, 30); return window.getSelection().toString();")
        before = browser.execute_script("return window.scrollY")
        assert before > 0
        api.chat.completions.create(model="flowstate", user="keep", messages=[{"role": "user", "content": "[two] go"}])
        wait_for(browser, "#request-2", timeout=15)
        assert browser.execute_script("return window.scrollY") == before
        assert browser.execute_script("return document.querySelector('#request-1 .step details').open")
        assert browser.execute_script("return document.activeElement.classList.contains('steps-toggle') && "
                                      "document.activeElement.closest('#request-1') !== null")
        assert "kn_3" in browser.find_element(By.ID, "state").text  # the panel still shows the state chosen
        still = browser.execute_script("const s = window.getSelection(); return s.toString() + '|' +"
                                       "(s.anchorNode.parentElement.closest('#request-1 .response') !== null);")
        assert selected == "rst " + "y" * 24 and still == selected + "|true"  # on the text rebuilt in place
        shots(browser, "kept")
    finally:
        browser.set_window_size(1400, 1000)
