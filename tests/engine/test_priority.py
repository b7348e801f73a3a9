"""Priorities by kind of call (parsed, a memory call never ahead of its request) and the lock the in-process
engines take calls by: the waiting call of the lowest priority goes first, ties in arrival order."""

from __future__ import annotations

import threading
import time

import pytest

from engine.priority import Priorities, PriorityLock
from engine.purpose import STEP, Purpose


def test_priorities_parse_and_order_a_memory_call_after_its_request() -> None:
    p = Priorities.parse("interactive=-5,background=7")
    assert (p.interactive, p.memory, p.background,
            p.evaluation) == (-5, 1, 7, 3) and str(Priorities.parse(str(p))) == str(p)
    memory = Purpose("mage.compress")
    assert [p.of("interactive", memory), p.of("background", memory), p.of("background", STEP)] == [1, 7, 7]
    assert Priorities.parse("off").of("background") == 0
    for bad, said in (("urgent=1", "KIND=INT"), ("memory=soon", "integer"), ("memory", "KIND=INT")):
        with pytest.raises(ValueError, match=said):
            Priorities.parse(bad)


def test_the_lock_lets_the_lowest_priority_in_first_then_by_arrival() -> None:
    lock, order = PriorityLock(), []
    lock.acquire(0)  # a call in progress; five arrive while it runs

    def call(name: str, priority: int) -> None:
        with lock.hold(priority):
            order.append(name)

    threads = []
    for name, priority in (("eval", 3), ("background-1", 2), ("interactive-1", 0), ("background-2", 2),
                           ("interactive-2", 0)):
        threads.append(threading.Thread(target=call, args=(name, priority)))
        threads[-1].start()
        deadline = time.monotonic() + 10
        while len(lock._waiting) < len(threads):  # each is waiting before the next arrives
            assert time.monotonic() < deadline
            time.sleep(0.005)
    lock.release()
    for t in threads:
        t.join(10)
    assert order == ["interactive-1", "interactive-2", "background-1", "background-2", "eval"]
