"""The console's pages for the operator of many tenants, in a real Chromium against a real server: an operator's day
signed in with the admin key — create a tenant, issue a key (its secret shown once), rotate it, set a quota, see the
tenant's turns move its usage, read its sessions as admin (the tenant named on every page, nothing to delete), find
each action in the audit trail, filter it and export it as JSON lines, revoke a key after a confirmation — and a
tenant's key that tries the admin pages gets nothing. Screenshots as in test_console.py."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx

from tests.serving.conftest import Server
from tests.serving.test_console import XSS, browser, shots, wait_for, wait_until
from tests.serving.test_tenants import ADMIN, admin, notes, remember

__all__ = ["browser", "shots"]  # the fixtures, used by name


def sign_in(browser: Any, root: str, key: str) -> None:
    from selenium.webdriver.common.by import By

    browser.get(root + "/ui/")
    browser.execute_script("sessionStorage.clear()")
    browser.get(root + "/ui/#/")
    for _ in range(3):  # the page may draw the form again as it starts: type into the one that stays
        wait_until(browser, lambda: browser.find_element(By.CSS_SELECTOR, "#sign-in #api-key").is_displayed(), 30)
        field = browser.find_element(By.ID, "api-key")
        field.clear()
        field.send_keys(key)
        browser.find_element(By.CSS_SELECTOR, "#sign-in button[type=submit]").click()
        try:
            wait_until(browser, lambda: not browser.find_elements(By.ID, "sign-in"), 15)
            return
        except Exception:  # the form was drawn anew under the click: sign in again
            continue


def sessions_of(url: str, key: str) -> list[str]:
    return [s["id"] for s in httpx.get(url + "/sessions", headers={"Authorization": f"Bearer {key}"},
                                       timeout=30).json()["data"]]


def text(browser: Any, css: str) -> str:
    from selenium.webdriver.common.by import By

    return str(browser.find_element(By.CSS_SELECTOR, css).text)


def test_an_operators_day_in_the_console(server: Server, browser: Any, shots: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    url = server.start(notes("[acme]", 6), "--admin-key", ADMIN)
    root = url.removesuffix("/v1")
    sign_in(browser, root, ADMIN)
    wait_until(browser, lambda: "No tenants yet." in text(browser, "main"), 30)  # the admin's first page: tenants
    assert browser.current_url.endswith("#/admin")
    assert browser.find_element(By.ID, "nav-audit").is_displayed()
    assert not browser.find_element(By.ID, "nav-sessions").is_displayed()  # an admin key has no memory of its own

    # create a tenant with a limit
    browser.find_element(By.ID, "new-tenant-name").send_keys("acme")
    browser.find_element(By.ID, "new-tenant-requests_per_minute").send_keys("100")
    browser.find_element(By.CSS_SELECTOR, "#new-tenant button[type=submit]").click()
    wait_until(browser, lambda: text(browser, "#tenant-name") == "acme")
    tenant = admin(url, "GET", "/tenants").json()["data"][0]
    assert tenant["name"] == "acme" and tenant["quota"]["requests_per_minute"] == 100
    assert "No keys" in text(browser, "main")

    # issue a key: its secret once, in the page, nowhere else
    browser.find_element(By.CSS_SELECTOR, "#new-key button[type=submit]").click()
    first = wait_for(browser, "#secret-value").text
    assert first.startswith("fs-") and len(first) > 40
    assert browser.find_element(By.ID, "copy-secret").is_displayed()
    [made] = admin(url, "GET", f"/tenants/{tenant['id']}/keys").json()["data"]
    assert text(browser, f"tr[data-key='{made['id']}'] .hint") == "fs-…" + first[-4:]
    kept = browser.execute_script("return JSON.stringify([Object.entries(sessionStorage), "
                                  "Object.entries(localStorage), location.href, document.cookie])")
    assert first not in kept and ADMIN in kept  # the admin key is the tab's, the tenant's secret is no one's
    shots(browser, "admin-tenant")

    # rotate it, the old key working 10 more minutes; the new secret shown once
    row = browser.find_element(By.CSS_SELECTOR, f"tr[data-key='{made['id']}']")
    Select(row.find_element(By.CSS_SELECTOR, "select.grace")).select_by_value("600")
    row.find_element(By.CSS_SELECTOR, "button.rotate").click()
    wait_until(browser, lambda: "rotated" in text(browser, "#admin-notice"))
    secret = text(browser, "#secret-value")
    assert secret.startswith("fs-") and secret != first
    keys = admin(url, "GET", f"/tenants/{tenant['id']}/keys").json()["data"]
    old = next(k for k in keys if k["id"] == made["id"])
    assert len(keys) == 2 and old["state"] == "active" and old["expires_at"] - time.time() < 601

    # set a quota: only what the form changed
    field = browser.find_element(By.ID, "quota-concurrent_turns")
    field.send_keys("4")
    browser.find_element(By.CSS_SELECTOR, "#quota-form button[type=submit]").click()
    wait_until(browser, lambda: text(browser, "#admin-notice") == "Quota set.")
    quota = admin(url, "GET", "/tenants").json()["data"][0]["quota"]
    assert quota == {"requests_per_minute": 100, "concurrent_turns": 4, "tokens_per_day": None}
    patched = [e for e in admin(url, "GET", "/audit").json()["data"] if e["action"] == "tenant.quota"]
    assert [e["detail"]["quota"]["requests_per_minute"] for e in patched] == [100]

    # the tenant's turns move its usage
    remember(url, secret, "trip", "[acme] remember the hotel")
    remember(url, first, "trip", "[acme] and the dates")  # the old key, in its grace
    browser.find_element(By.ID, "nav-tenants").click()
    acme = wait_for(browser, f"tr[data-tenant='{tenant['id']}']")
    wait_until(browser, lambda: acme.find_element(By.CSS_SELECTOR, ".sessions").text == "1")
    assert acme.find_element(By.CSS_SELECTOR, ".requests").text in ("2 / 100", "1 / 100")  # unless a minute turned
    assert not acme.find_element(By.CSS_SELECTOR, ".tokens").text.startswith("0 ")
    shots(browser, "admin-tenants")

    # its use over time, from the server's own hourly counts, plotted
    acme.find_element(By.CSS_SELECTOR, ".tenant-link").click()
    charts = wait_for(browser, "#usage-charts")
    values = {kind: [int(b.get_attribute("data-value")) for b in charts.find_elements(
        By.CSS_SELECTOR, f".{kind} .bar:not(.refused)")] for kind in ("requests", "tokens")}
    history = admin(url, "GET", f"/tenants/{tenant['id']}/usage").json()["data"]
    assert sum(values["requests"]) == 2 == sum(p["requests"] for p in history)
    assert sum(values["tokens"]) == sum(p["tokens"] for p in history) > 0
    browser.execute_script("document.getElementById('usage').scrollIntoView()")
    shots(browser, "admin-usage")
    browser.find_element(By.ID, "usage-other").click()
    wait_until(browser, lambda: browser.find_element(By.ID, "usage-charts").get_attribute("data-bucket") == "day")
    assert len(browser.find_elements(By.CSS_SELECTOR, "#usage-charts .requests .bar")) == 1  # today's

    # read its sessions as admin: named on every page, read-only
    wait_for(browser, "#read-sessions").click()
    wait_for(browser, "tr[data-session='trip']")
    assert "Tenant acme" in text(browser, "#viewing") and "read-only" in text(browser, "#viewing")
    assert not browser.find_elements(By.CSS_SELECTOR, "button.delete")
    browser.find_element(By.LINK_TEXT, "trip").click()
    wait_for(browser, "#state-graph .node[data-id='note_1']")
    assert text(browser, "#viewing-name") == "acme" and "/t/" in browser.current_url
    shots(browser, "admin-reads-a-tenant")

    # the audit trail: each action, filtered, exported
    browser.find_element(By.ID, "nav-audit").click()
    wait_for(browser, "#audit")
    actions = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#audit .action")]
    for action in ("tenant.create", "key.create", "key.rotate", "tenant.quota", "session.read"):
        assert action in actions, (action, actions)
    Select(browser.find_element(By.ID, "audit-actor")).select_by_value("tenant")
    browser.find_element(By.CSS_SELECTOR, "#audit-filter button[type=submit]").click()
    wait_until(browser, lambda: "actor=tenant" in browser.current_url)
    wait_until(browser, lambda: {e.text for e in browser.find_elements(By.CSS_SELECTOR, "#audit .action")}
               <= {"session.read"} or "No entry matches." in text(browser, "main"))
    browser.get(root + "/ui/#/admin/audit?action=key.rotate")
    wait_until(browser, lambda: [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#audit .action")]
               == ["key.rotate"])
    row = browser.find_element(By.CSS_SELECTOR, "#audit tr[data-action='key.rotate']")
    row.find_element(By.TAG_NAME, "summary").click()
    assert json.loads(row.find_element(By.CSS_SELECTOR, ".detail").text) == {"rotated": made["id"], "grace_s": 600}
    shots(browser, "admin-audit")
    browser.execute_cdp_cmd("Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(tmp_path)})
    browser.get(root + "/ui/#/admin/audit")  # the same page unfiltered: wait for it, not the one before
    wait_until(browser, lambda: browser.find_element(By.ID, "audit-action").get_attribute("value") == "")
    browser.find_element(By.ID, "audit-export").click()
    wait_until(browser, lambda: (tmp_path / "audit.jsonl").exists())
    exported = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert [e["id"] for e in exported] == [e["id"] for e in admin(url, "GET", "/audit?limit=1000").json()["data"]]
    assert "Exported %d entries" % len(exported) in text(browser, "#audit-exported")
    browser.get(root + "/ui/#/admin/audit?action=" + XSS)  # markup in what the page shows stays text
    wait_until(browser, lambda: "unknown action" in text(browser, "#audit-error"))
    assert XSS in text(browser, "#audit-error")
    assert browser.execute_script("return window.__pwned === undefined && !document.querySelector('main img')")

    # erase a subject: what would go, then (confirmed) the erasure and its receipt
    remember(url, secret, "alice", "[acme] alice's own words")
    browser.get(root + "/ui/#/admin/tenant/" + tenant["id"])
    wait_for(browser, "#erasure-subject").send_keys("alice")
    browser.find_element(By.CSS_SELECTOR, "#erasure-form button[type=submit]").click()
    wait_until(browser, lambda: [li.text for li in browser.find_elements(By.CSS_SELECTOR, "#erasure-sessions li")]
               == ["alice"])
    assert "1 requests" in text(browser, "#erasure-preview")
    browser.find_element(By.ID, "erase").click()
    alert = browser.switch_to.alert
    assert '"alice"' in alert.text and "acme" in alert.text and "1 sessions" in alert.text
    alert.dismiss()
    assert sorted(sessions_of(url, secret)) == ["alice", "trip"]  # not confirmed: nothing erased
    browser.find_element(By.ID, "erase").click()
    browser.switch_to.alert.accept()
    receipt_id = wait_for(browser, "#receipt-id").text
    assert receipt_id.startswith("era_") and sessions_of(url, secret) == ["trip"]
    assert "1 sessions" in text(browser, "#erasure-receipt") and "alice" not in text(browser, "#erasure-receipt")
    receipt = httpx.get(f"{url}/erasure/{receipt_id}", headers={"Authorization": f"Bearer {secret}"}, timeout=30)
    assert receipt.json()["removed"]["sessions"] == 1  # the tenant's receipt
    shots(browser, "admin-erasure")

    # revoke the old key: asked first, naming it
    browser.get(root + "/ui/#/admin/tenant/" + tenant["id"])
    button = wait_for(browser, f"tr[data-key='{made['id']}'] button.revoke")
    button.click()
    alert = browser.switch_to.alert
    assert made["id"] in alert.text and "acme" in alert.text
    alert.dismiss()  # not confirmed: still working
    assert remember(url, first, "trip", "[acme] still here").choices[0].message.content
    browser.find_element(By.CSS_SELECTOR, f"tr[data-key='{made['id']}'] button.revoke").click()
    browser.switch_to.alert.accept()
    wait_until(browser, lambda: text(browser, f"tr[data-key='{made['id']}'] .state") == "revoked")
    assert httpx.get(url + "/sessions", headers={"Authorization": f"Bearer {first}"}, timeout=30).status_code == 401

    # a tenant's key signs in to its own memory; the admin pages give it nothing
    browser.find_element(By.ID, "sign-out").click()
    sign_in(browser, root, secret)
    wait_for(browser, "tr[data-session='trip']")
    assert not browser.find_element(By.ID, "nav-tenants").is_displayed()
    browser.get(root + "/ui/#/admin")
    wait_until(browser, lambda: "admin key" in text(browser, "main"))
    assert not browser.find_elements(By.CSS_SELECTOR, "#tenants, #new-tenant")
    browser.get(root + "/ui/#/")
    wait_for(browser, "tr[data-session='trip']")
    browser.get(root + "/ui/#/admin/audit")
    wait_until(browser, lambda: "admin key" in text(browser, "main"))
    assert not browser.find_elements(By.CSS_SELECTOR, "#audit")
    browser.get(root + "/ui/#/t/" + tenant["id"] + "/")  # naming a tenant does not make a tenant's key an admin
    wait_for(browser, "tr[data-session='trip']")
    assert not browser.find_elements(By.ID, "viewing")
