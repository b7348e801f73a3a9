"""Recognising resent history, session naming, keys, and the server's memory of live sessions."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from typing import Any

import anyio
import pytest

from flowstate import Repository
from serving.errors import APIError
from serving.history import fingerprint, match, new_messages
from serving.naming import check_name, header_text, session_name
from serving.registry import Registry
from serving.tenancy import Authenticator

U1 = {"role": "user", "content": "first"}
A1 = {"role": "assistant", "content": "answer one"}
U2 = {"role": "user", "content": "second"}
CALLS = {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "name": "t", "arguments": "{}"}]}
T1 = {"role": "tool", "tool_call_id": "call_1", "content": "42"}


@pytest.mark.parametrize(("incoming", "seen", "new"), [
    ([U1], [], [U1]),  # a first message
    ([U1, A1, U2], [U1, A1], [U2]),  # the whole history, then what is new
    ([U2], [U1, A1], [U2]),  # only the new message
    ([T1], [U1, CALLS], [T1]),  # only the tool results
    ([U1, CALLS, T1], [U1, CALLS], [T1]),
    ([U1], [U1, A1], [U1]),  # one message: new, even if it repeats the first
])
def test_new_messages(incoming: list[Any], seen: list[Any], new: list[Any]) -> None:
    found = new_messages(incoming, seen)
    assert found.kind == "continues" and found.new == new


def test_an_answered_turn_resent_whole_is_a_replay() -> None:
    found = new_messages([U1, A1, U2], [U1, A1, U2, CALLS, T1, A1])
    assert found.kind == "replay" and found.at == 3
    assert match([U1, A1, U2], [U1, A1, U2, A1]).kind == "replay"
    assert match([U1, A1, U2, A1], [U1, A1]).kind == "continues"


@pytest.mark.parametrize(("incoming", "at"), [
    ([U1, {"role": "assistant", "content": "something else"}, U2], "message 2"),
    ([U1, A1], "message 3"),  # ends before what the server answered last
])
def test_contradicting_history_is_a_409(incoming: list[Any], at: str) -> None:
    with pytest.raises(APIError) as info:
        new_messages(incoming, [U1, A1, U2, A1])
    assert info.value.status == 409 and at in info.value.message and info.value.code == "history_mismatch"


@pytest.mark.parametrize("name", ["alice", "café", "user@example.com", "team-a:42", "a.b_c~d+e=f", "Ωμέγα", "x" * 200])
def test_valid_session_names(name: str) -> None:
    assert check_name(name) == name


@pytest.mark.parametrize("name",
                         ["", "a/b", "../x", "x/graph", ".", "..", "a b", "tab\there", "x" * 201, "50%", "q?x", "h#1"])
def test_invalid_session_names_are_refused(name: str) -> None:
    with pytest.raises(APIError) as info:
        check_name(name)
    assert (info.value.status == 400 and info.value.code == "invalid_session"
            and "letters and digits" in info.value.message)


def test_a_header_name_is_utf8_like_the_user_field() -> None:
    as_sent = "café".encode().decode("latin-1")  # what HTTP hands over for the header's bytes
    assert session_name(header_text(as_sent, "x-flowstate-session"), None) == session_name(None, "café") == "café"
    assert check_name("cafe\u0301") == "café"  # one name, whichever Unicode form the client sends
    with pytest.raises(APIError):
        header_text("\xff\xfe", "x-flowstate-session")


def test_names_fingerprints_and_keys(repo: Repository, tmp_path: Path) -> None:
    assert session_name("hdr",
                        "usr") == "hdr" and session_name(None, "usr") == "usr" and session_name(None, None) is None
    fp = fingerprint("policy", [U1, A1])
    assert fp.startswith("fp-") and fp == fingerprint("policy", [U1, A1, U2])  # stable over the conversation
    assert fp != fingerprint("other policy", [U1])
    keys = Authenticator(repo.tenants, ["k1", "k2"])
    one, two, same = (anyio.run(keys.caller, h) for h in ("Bearer k1", "Bearer k2", "bearer k1"))
    assert one.namespace == "k" + hashlib.sha256(b"k1").hexdigest()[:16] + "/"  # what it has always been
    assert one.namespace != two.namespace and same == one
    for bad in (None, "Bearer", "Bearer k3", "Basic k1"):
        refused = anyio.run(keys.caller, bad)
        assert refused.namespace is None and refused.error is not None and refused.error.status == 401
    with Repository.open(tmp_path / "open.db") as empty:
        assert anyio.run(Authenticator(empty.tenants).caller, None).namespace == ""


def test_idle_sessions_leave_memory_but_waiting_ones_stay(repo: Repository) -> None:
    async def scenario() -> None:
        left: list[str] = []
        sessions = Registry(repo, keep=2, on_leave=left.append)
        waiting = await sessions.live("a")
        waiting.run = object()  # type: ignore[assignment]  # stands for a request waiting on tool results
        await sessions.live("b")
        await sessions.live("c")
        assert sessions.peek("a") is waiting and sessions.peek("b") is None and sessions.peek("c") is not None
        assert left == ["b"]  # what the server's tools hold for b may go (a session-scoped MCP server)
        sessions.forget("c")
        assert left == ["b", "c"]

    asyncio.run(scenario())


def test_eviction_pressure_never_breaks_a_sessions_lock(repo: Repository) -> None:
    """The race an adversarial probe found: turn A releases, turn B waits to wake, other sessions push S out
    of memory — and a new turn D of S must still wait for B, never run beside it."""

    async def scenario() -> list[str]:
        sessions = Registry(repo, keep=2)
        order: list[str] = []

        async def turn(tag: str, hold: float) -> None:
            await sessions.enter("s")
            try:
                await sessions.live("s")
                order.append(f"{tag} in")
                await asyncio.sleep(hold)
                order.append(f"{tag} out")
            finally:
                sessions.leave("s")

        a = asyncio.create_task(turn("A", 0.05))
        await asyncio.sleep(0.01)
        b = asyncio.create_task(turn("B", 0.05))  # waits on A
        await asyncio.sleep(0.01)
        for i in range(50):  # pressure: sessions passing through memory (as another key's cheap 400s do)
            await sessions.enter(f"other{i}")
            await sessions.live(f"other{i}")
            sessions.leave(f"other{i}")
        await a
        d = asyncio.create_task(turn("D", 0.01))  # arrives while B holds the lock
        await asyncio.gather(b, d)
        assert sessions.held() == 0  # every lock entry went with its last holder: nothing leaks
        assert sessions.in_memory() <= 2
        return order

    assert asyncio.run(scenario()) == ["A in", "A out", "B in", "B out", "D in", "D out"]


def test_refused_names_leave_no_lock_behind(repo: Repository) -> None:
    async def scenario() -> int:
        sessions = Registry(repo, keep=4)
        for i in range(20_000):
            await sessions.enter(f"ghost{i}")
            sessions.leave(f"ghost{i}")
        return sessions.held()

    assert asyncio.run(scenario()) == 0


def test_a_session_stored_before_the_transcripts_table_loads_as_it_did(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from flowstate import Repository
    from flowstate.store.repository import Transcript
    from serving.live import load_live

    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    with Repository.open(tmp_path / "m.db") as repo:
        # before migration 0006 the endpoint's transcript rode in the run record
        repo.persist_request("old", 1, "hi", "hello", [], {"transcript": messages[:1], "idempotency": {"k": 1}})
        repo.persist_request("new", 1, "hi", "hello", [], {}, transcript=Transcript(messages[:1], {"k": 1}))
        old, new = load_live(repo, "old"), load_live(repo, "new")
    assert old.transcript == new.transcript == messages
    for live in (old, new):  # the key's reply is the assistant message at 1
        assert live.replied("k") and live.earlier_reply("k", messages[:1], resent_history=False) == 1


def test_idle_sessions_are_held_within_a_byte_budget(repo: Repository) -> None:
    """--session-memory: sessions holding large tool results leave memory, least recently used first, once they hold
    more than the budget together; one whose request waits on tool results stays; a deleted one goes."""
    async def scenario() -> None:
        left: list[str] = []
        sessions = Registry(repo, keep=4096, on_leave=left.append, budget=5 << 20)
        waiting = await sessions.live("waiting")
        waiting.transcript.append({"role": "tool", "tool_call_id": "c", "content": "x" * (3 << 20)})
        waiting.run = object()  # type: ignore[assignment]  # a request waiting on tool results
        for i in range(10):
            await sessions.enter(f"s{i}")
            live = await sessions.live(f"s{i}")
            live.transcript.append({"role": "tool", "tool_call_id": "c", "content": {"rows": ["y" * (1 << 20)]}})
            sessions.leave(f"s{i}")
            assert sessions.held_bytes() <= (5 << 20) + (1 << 20)  # the budget, and at most the session just used
        assert sessions.peek("waiting") is waiting  # never evicted while it waits
        assert [n for n in (f"s{i}" for i in range(10)) if sessions.peek(n)] == ["s9"]  # 3 MiB + 1 MiB fit, no more
        assert left == [f"s{i}" for i in range(9)]
        assert sessions.held_bytes() == waiting.bytes() + (sessions.peek("s9") or waiting).bytes()
        sessions.forget("s9")
        assert sessions.held_bytes() == waiting.bytes() and left[-1] == "s9"

    asyncio.run(scenario())


@pytest.mark.slow
def test_bench_sessions_measures_a_servers_memory_with_and_without_a_budget() -> None:
    """``flowstate bench sessions``: real servers, the official client, memory read from /proc; the figures hold
    together (what a budget bounds is measured in docs/serving.md, by hand)."""
    from flowstate.bench.sessions import bench_sessions, render_table

    rows = bench_sessions(3, 0.5, [1.0, None], progress=lambda _: None)
    assert [r["session_memory_mb"] for r in rows] == [1.0, "unbounded"] and all(r["sessions"] == 3 for r in rows)
    assert all(r["rss_start_mb"] > 10 and r["rss_held_mb"] >= r["rss_start_mb"] for r in rows)
    assert render_table(rows).count("\n") == 3
