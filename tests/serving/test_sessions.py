"""Recognising resent history, session naming, keys, and the server's memory of live sessions."""

from __future__ import annotations

from typing import Any

import pytest

from flowstate import Repository
from serving.app import _Sessions
from serving.errors import APIError
from serving.sessions import Keys, new_messages, session_name

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
    assert new_messages(incoming, seen) == new


@pytest.mark.parametrize(("incoming", "at"), [
    ([U1, {"role": "assistant", "content": "something else"}, U2], "message 2"),
    ([U1, A1], "message 3"),  # ends before what the server answered last
])
def test_contradicting_history_is_a_409(incoming: list[Any], at: str) -> None:
    with pytest.raises(APIError) as info:
        new_messages(incoming, [U1, A1, U2, A1])
    assert info.value.status == 409 and at in info.value.message and info.value.code == "history_mismatch"


def test_names_and_keys() -> None:
    assert session_name("hdr", "usr", "", [U1]) == "hdr" and session_name(None, "usr", "", [U1]) == "usr"
    fp = session_name(None, None, "policy", [U1, A1])
    assert fp.startswith("fp-") and fp == session_name(None, None, "policy", [U1, A1, U2])  # stable over the conversation
    assert fp != session_name(None, None, "other policy", [U1])
    keys = Keys(["k1", "k2"])
    assert keys.namespace("Bearer k1") != keys.namespace("Bearer k2")
    assert keys.namespace("bearer k1") == keys.namespace("Bearer k1")
    for bad in (None, "Bearer", "Bearer k3", "Basic k1"):
        with pytest.raises(APIError) as info:
            keys.namespace(bad)
        assert info.value.status == 401
    assert Keys([]).namespace(None) == ""


def test_idle_sessions_leave_memory_but_waiting_ones_stay(repo: Repository) -> None:
    sessions = _Sessions(repo, keep=2)
    waiting = sessions.live("a")
    waiting.run = object()  # type: ignore[assignment]  # stands for a request waiting on tool results
    sessions.live("b")
    sessions.live("c")
    assert sessions.peek("a") is waiting and sessions.peek("b") is None and sessions.peek("c") is not None
