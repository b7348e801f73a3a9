"""Tenants' quotas on real servers with the official ``openai`` client: requests per minute, concurrent turns and
model tokens per day each refuse with OpenAI's 429 (its headers, and ``insufficient_quota`` telling the client not to
retry) before anything is stored; the client's own retry gets through once a slot frees; two servers on one
PostgreSQL admit no more than the limit together; a killed server's turn stops counting when its lease lapses."""

from __future__ import annotations

import os
import signal
import sqlite3
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.helpers import add, output
from tests.serving.conftest import Server
from tests.serving.test_tenants import ADMIN, admin, notes

SLOW = ("--tools", "tests.serving.slow_tools:TOOLS")


def slow(seconds: float, n: int = 1) -> list[dict[str, Any]]:
    return [line for _ in range(n) for line in (
        {"text": output(tools=[{"name": "wait", "arguments": {"seconds": seconds}}]), "when": "[slow]"},
        {"text": output(delta=[add("kn_waited", waited=True)], content="done waiting"), "when": "[slow]"})]


def tenant(url: str, name: str, **quota: int) -> tuple[str, str]:
    made = admin(url, "POST", "/tenants", name=name, quota=quota)
    assert made.status_code == 201, made.text
    key = admin(url, "POST", f"/tenants/{made.json()['id']}/keys")
    return made.json()["id"], key.json()["secret"]


def ask(url: str, key: str, text: str, session: str = "s", retries: int = 0) -> Any:
    api = openai.OpenAI(base_url=url, api_key=key, max_retries=retries)
    return api.chat.completions.create(model="flowstate", messages=[{"role": "user", "content": text}], user=session)


def raw(url: str, key: str, text: str, session: str = "s") -> httpx.Response:
    return httpx.post(url + "/chat/completions", headers={"Authorization": f"Bearer {key}"}, timeout=60,
                      json={"model": "flowstate", "user": session, "messages": [{"role": "user", "content": text}]})


def throttled(url: str, key: str) -> dict[str, float]:
    body = httpx.get(url.removesuffix("/v1") + "/metrics", headers={"Authorization": f"Bearer {key}"}, timeout=30).text
    return {line.split('"')[1]: float(line.rsplit(" ", 1)[1]) for line in body.splitlines()
            if line.startswith("flowstate_throttled_requests_total{")}


def test_requests_per_minute_refuse_with_openais_429_and_store_nothing(server: Server) -> None:
    url = server.start(notes("[rpm]", 5), "--admin-key", ADMIN)
    tenant_id, key = tenant(url, "minute", requests_per_minute=2)
    if time.time() % 60 > 55:  # the three requests in one minute
        time.sleep(61 - time.time() % 60)
    ask(url, key, "[rpm] one", "a")
    ask(url, key, "[rpm] two", "a")
    refused = raw(url, key, "[rpm] three", "b")
    assert refused.status_code == 429, refused.text
    error = refused.json()["error"]
    assert (error["code"], error["type"]) == ("rate_limit_exceeded", "requests") and "per minute" in error["message"]
    h = refused.headers
    assert (h["x-ratelimit-limit-requests"], h["x-ratelimit-remaining-requests"]) == ("2", "0")
    assert 1 <= int(h["retry-after"]) <= 60 and h["x-ratelimit-reset-requests"].endswith("s")
    with pytest.raises(openai.RateLimitError) as info:
        ask(url, key, "[rpm] four", "b")
    assert info.value.code == "rate_limit_exceeded"
    sessions = httpx.get(url + "/sessions", headers={"Authorization": f"Bearer {key}"}, timeout=30).json()["data"]
    assert [(s["id"], s["requests"]) for s in sessions] == [("a", 2)]  # the refused ones stored nothing
    assert throttled(url, key) == {"requests": 2.0}
    usage = httpx.get(url + "/usage", headers={"Authorization": f"Bearer {key}"}, timeout=30).json()
    assert usage["tenant"] == tenant_id and usage["quota"]["requests_per_minute"] == 2
    assert usage["usage"]["requests_this_minute"] == 2 and usage["usage"]["tokens_today"] > 0


def test_a_turn_over_the_concurrency_limit_gets_through_on_the_clients_own_retry(server: Server) -> None:
    url = server.start(slow(2.5, 2), "--admin-key", ADMIN, *SLOW)
    _, key = tenant(url, "one-at-a-time", concurrent_turns=1)
    answered: list[Any] = []
    first = threading.Thread(target=lambda: answered.append(ask(url, key, "[slow] first", "one")))
    first.start()
    time.sleep(1.0)
    assert raw(url, key, "[slow] second", "two").status_code == 429  # one runs: the second waits its turn
    started = time.monotonic()
    r = ask(url, key, "[slow] second", "two", retries=8)  # the SDK sleeps Retry-After (1 s) and tries again
    first.join(60)
    assert r.choices[0].message.content == "done waiting" and time.monotonic() - started > 1.0
    assert [a.choices[0].message.content for a in answered] == ["done waiting"]  # the first was answered too
    assert throttled(url, key)["turns"] >= 2


def test_a_spent_daily_budget_is_insufficient_quota_and_the_client_does_not_retry(server: Server) -> None:
    url = server.start(notes("[day]", 3), "--admin-key", ADMIN)
    tenant_id, key = tenant(url, "frugal", tokens_per_day=50)
    ask(url, key, "[day] one")  # admitted with budget left; it spends more than 50 tokens
    with pytest.raises(openai.RateLimitError) as info:
        ask(url, key, "[day] two", retries=2)  # the SDK would retry a 429 twice; x-should-retry: false stops it
    assert info.value.code == "insufficient_quota" and info.value.type == "insufficient_quota"
    assert info.value.response.headers["x-should-retry"] == "false"
    assert info.value.response.headers["x-ratelimit-remaining-tokens"] == "0"
    assert throttled(url, key) == {"tokens": 1.0}  # one request reached the server, not three
    background = httpx.post(url + "/responses", headers={"Authorization": f"Bearer {key}"}, timeout=30,
                            json={"model": "flowstate", "input": "[day] later", "background": True})
    assert background.status_code == 429 and background.json()["error"]["code"] == "insufficient_quota"
    with sqlite3.connect(server.db) as db:  # a refused background response is not stored, even in progress
        assert db.execute("SELECT COUNT(*) FROM responses").fetchone() == (0,)
        assert db.execute("SELECT name FROM sessions").fetchall() == [(f"{tenant_id}/s",)]
    raised = admin(url, "PATCH", f"/tenants/{tenant_id}", quota={"tokens_per_day": 10**9})
    assert raised.status_code == 200 and raised.json()["quota"]["tokens_per_day"] == 10**9
    assert ask(url, key, "[day] two").choices[0].message.content == "noted 1"  # in force for the next request


def test_bad_quotas_are_refused_and_change_nothing(server: Server) -> None:
    url = server.start(notes("[q]", 1), "--admin-key", ADMIN)
    tenant_id, _ = tenant(url, "limited", requests_per_minute=10)
    for quota in ({"requests_per_minute": 0}, {"requests_per_minute": -3}, {"concurrent_turns": 10**9},
                  {"tokens_per_day": 10**20}, {"tokens": 5}, {"requests_per_minute": "many"}):
        assert admin(url, "POST", "/tenants", name="other", quota=quota).status_code == 422, quota
        assert admin(url, "PATCH", f"/tenants/{tenant_id}", quota=quota).status_code == 422, quota
    assert admin(url, "PATCH", "/tenants/t0", quota={}).status_code == 404
    assert [(t["name"], t["quota"]["requests_per_minute"]) for t in admin(url, "GET", "/tenants").json()["data"]] == \
        [("limited", 10)]


@pytest.mark.slow
def test_two_servers_on_one_postgresql_admit_no_more_than_the_limit_together(
        two_servers: tuple[Server, Server]) -> None:
    url_a, url_b = (s.start(notes("[pg]", 20) + slow(3.0, 2), "--admin-key", ADMIN, *SLOW) for s in two_servers)
    _, key = tenant(url_a, "shared", requests_per_minute=5)
    if time.time() % 60 > 40:  # the twelve within one minute
        time.sleep(61 - time.time() % 60)
    with ThreadPoolExecutor(12) as pool:  # 12 at once, half to each server
        codes = list(pool.map(lambda i: raw(url_a if i % 2 else url_b, key, f"[pg] {i}", f"s{i}").status_code,
                              range(12)))
    assert sorted(codes) == [200] * 5 + [429] * 7, codes
    _, one = tenant(url_a, "single", concurrent_turns=1)
    answered: list[Any] = []
    first = threading.Thread(target=lambda: answered.append(ask(url_a, one, "[slow] on a", "x")))
    first.start()
    time.sleep(1.0)
    refused = raw(url_b, one, "[slow] on b", "y")  # the other server sees the running turn
    first.join(60)
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert [a.choices[0].message.content for a in answered] == ["done waiting"]  # the slot's turn was answered


@pytest.mark.slow
def test_a_killed_servers_turn_stops_counting_when_its_lease_lapses(server: Server) -> None:
    lease = 8  # longer than a server's restart on a loaded machine: the restarted server sees the slot still held
    url = server.start(slow(20.0, 1), "--admin-key", ADMIN, "--turn-lease", str(lease), *SLOW)
    _, key = tenant(url, "killed", concurrent_turns=1)

    ended: list[str] = []

    def long_turn() -> None:
        try:
            ended.append(f"answered {raw(url, key, '[slow] long', 'x').status_code}")
        except httpx.HTTPError as exc:  # its server is killed under it
            ended.append(f"cut off: {type(exc).__name__}")

    turn = threading.Thread(target=long_turn, daemon=True)
    turn.start()
    deadline = time.monotonic() + 30
    while httpx.get(url + "/usage", headers={"Authorization": f"Bearer {key}"}, timeout=30
                    ).json()["usage"]["running_turns"] != 1:  # the turn holds its slot: now kill its server
        assert time.monotonic() < deadline, "the turn never started"
        time.sleep(0.1)
    assert server.proc is not None
    os.kill(server.proc.pid, signal.SIGKILL)
    server.proc.wait(timeout=30)
    url = server.start(notes("[after]", 2), "--admin-key", ADMIN, "--turn-lease", str(lease), *SLOW)
    held = raw(url, key, "[after] one", "y")
    killed_at = time.monotonic()
    assert held.status_code == 429  # the dead server's turn still holds the slot, within its lease ...
    while (r := raw(url, key, "[after] one", "y")).status_code == 429:
        assert time.monotonic() - killed_at < lease + 10, "the slot never came back"
        time.sleep(0.5)
    assert r.status_code == 200  # ... and not for ever
    turn.join(30)
    assert not turn.is_alive() and len(ended) == 1 and ended[0].startswith("cut off"), ended  # its server died


def test_the_admission_bench_times_each_step_as_the_server_runs_it(tmp_path: Path) -> None:
    """``flowstate bench admission``'s rows: every step timed, a lookup dearer than the cache, and the quota counted
    what the bench admitted (its ends freed every slot)."""
    from flowstate.bench.admission import bench_admission, render_table

    db = str(tmp_path / "bench.db")
    rows = bench_admission({"sqlite": lambda: db}, 20)
    by = {r["step"]: r for r in rows}
    assert len(by) == 5 and all(0 < r["p50_ms"] <= r["p99_ms"] for r in rows)
    assert by["key, looked up"]["p50_ms"] > by["key, cached"]["p50_ms"]
    assert "| sqlite | key + quota admission (before the turn) |" in render_table(rows)
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT COUNT(*) FROM quota_turns").fetchone() == (0,)
        assert conn.execute("SELECT SUM(tokens) FROM quota_days").fetchone() == (100 * 2 * 21,)
        # this minute and the last kept
        assert conn.execute("SELECT SUM(requests) FROM quota_minutes").fetchone() == (42,)


def test_a_turn_the_model_breaks_is_not_charged_to_the_tenants_minute(server: Server) -> None:
    broken = [{"text": "no tagged blocks at all", "when": "[bad]"}] * 3
    url = server.start(broken + notes("[ok]", 1), "--admin-key", ADMIN, "--max-protocol-errors", "3")
    _, key = tenant(url, "breaks", requests_per_minute=1)
    if time.time() % 60 > 50:  # both requests in one minute
        time.sleep(61 - time.time() % 60)
    failed = raw(url, key, "[bad] answer this", "a")
    assert failed.status_code == 502 and failed.json()["error"]["code"] == "request_failed", failed.text
    usage = httpx.get(url + "/usage", headers={"Authorization": f"Bearer {key}"}, timeout=30).json()["usage"]
    assert usage["requests_this_minute"] == 0 and usage["tokens_today"] > 0  # the tokens were spent all the same
    assert ask(url, key, "[ok] and this", "b").choices[0].message.content == "noted 0"  # the one request a minute
    assert raw(url, key, "[ok] one more", "c").status_code == 429


@pytest.mark.parametrize("db", ["sqlite", "postgres"])
def test_a_tenants_use_over_time_counts_what_ended_and_what_was_refused(db: str, server: Server,
                                                                        request: pytest.FixtureRequest) -> None:
    if db == "postgres":
        server.db = request.getfixturevalue("pg_server").new_database()  # type: ignore[assignment]
    url = server.start(notes("[use]", 6), "--admin-key", ADMIN)
    if time.time() % 3600 > 3590:  # the requests in one hour
        time.sleep(3600 - time.time() % 3600 + 0.5)
    limited, key = tenant(url, "limited", tokens_per_day=1)
    free, free_key = tenant(url, "free")
    assert raw(url, key, "[use] one").status_code == 200
    for _ in range(2):
        assert raw(url, key, "[use] two").status_code == 429  # the day's tokens are spent
    for i in range(3):
        assert raw(url, free_key, f"[use] {i}").status_code == 200  # no limit: counted all the same

    def points(tenant_id: str, **params: Any) -> list[dict[str, Any]]:
        got = admin(url, "GET", f"/tenants/{tenant_id}/usage?" + "&".join(f"{k}={v}" for k, v in params.items()))
        assert got.status_code == 200, got.text
        return list(got.json()["data"])

    hours = points(limited)
    assert len(hours) == 48 and hours[-1]["start"] == int(time.time() // 3600) * 3600
    assert [(p["requests"], p["refused"]) for p in hours if p["requests"] or p["refused"]] == [(1, 2)]
    assert hours[-1]["tokens"] > 0 and sum(p["tokens"] for p in hours[:-1]) == 0
    days = points(free, bucket="day")
    assert len(days) == 30 and days[-1]["requests"] == 3 and days[-1]["refused"] == 0
    assert days[-1]["tokens"] == sum(p["tokens"] for p in points(free))  # a day is its hours
    now = time.time()
    assert points(free, since=int(now) - 7200, until=int(now) - 3600)[-1]["requests"] == 0  # before them
    for query, status in (("bucket=week", 422), (f"since={now}&until={now - 10}", 400),
                          ("since=0", 400), ("since=soon", 422)):
        bad = admin(url, "GET", f"/tenants/{free}/usage?{query}")
        assert bad.status_code == status, (query, bad.text)
    assert admin(url, "GET", "/tenants/t-nobody/usage").status_code == 404
    assert admin(url, "GET", f"/tenants/{free}/usage", key=free_key).status_code == 403
