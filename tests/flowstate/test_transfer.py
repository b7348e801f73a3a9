"""The portable session file: export → import → export gives the same bytes on SQLite → PostgreSQL → SQLite, the
imported session's next request sees the same prompt, a fork exported alone imports alone, and every bad file —
truncated, edited, newer, hostile — is refused by name with the database as it was."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from engine.scripted import ScriptedEngine
from flowstate import Agent, Repository
from flowstate.demo import hotel
from flowstate.nodes import Node, Ref, Relation, StateType
from flowstate.store import transfer
from flowstate.store.repository import Transcript
from flowstate.store.responses import StoredResponse
from flowstate.store.transfer import BadSessionFile, SessionExists

SCRIPT = [json.loads(line)["text"] for line in hotel.script_path().read_text().splitlines() if line.strip()]


def two_requests(repo: Repository, session: str = "k1/trip") -> int:
    """The hotel case's first two requests, by the agent itself; the model calls they took."""
    engine = ScriptedEngine(SCRIPT)
    agent = Agent(engine, repository=repo, session=session, tools=hotel.TOOLS, task_policy=hotel.POLICY)
    for q in hotel.QUERIES[:2]:
        agent.run(q)
    return len(engine.prompts)


def third_prompts(repo: Repository, used: int, session: str = "k1/trip") -> list[Any]:
    engine = ScriptedEngine(SCRIPT[used:])
    Agent(engine, repository=repo, session=session, tools=hotel.TOOLS, task_policy=hotel.POLICY).run(hotel.QUERIES[2])
    return [[(m.role, m.content) for m in prompt] for prompt in engine.prompts]


def furnish(repo: Repository) -> None:
    """Beside the agent's session: a fork with a relation into what it shares, a transcript with an idempotency
    reply, a conversation, stored responses and a request waiting on tool results."""
    repo.lineage.fork("k1/trip", 1, "k1/trip-b")
    repo.persist_request("k1/trip-b", 2, "Switch to B", "Switched.", [
        Node(id="dec_switch_b", type=StateType.JUDGEMENT, summary="Switch to hotel B", value={"hotel": "B"},
             refs=(Ref(rel=Relation.SUPERSEDES, state_id="dec_book_a"),), request=2)], {"steps": []},
        transcript=Transcript([{"role": "user", "content": "Switch to B"}, {"role": "assistant", "content": "ok"}],
                              {"idem-1": 1}), strategy="flowstate")
    repo.conversations.save("k1/trip", {"topic": "lisbon"}, 1_790_000_000)
    for i in range(2):
        repo.responses.save(StoredResponse(f"resp_{i}", "k1/", "k1/trip", i, {"id": f"resp_{i}", "output": [i],
                                                                                "conversation": {"id": "trip"}},
                                          [{"type": "message", "content": f"in {i}"}]), 1_790_000_000 + i)
    repo.waiting.save("k1/trip-b", 3, {"session": "k1/trip-b", "query": "more?", "steps": []})


def body(lines: list[str]) -> list[str]:
    return lines[1:]


def sealed(lines: list[str]) -> list[str]:
    """A body (edited by a test) under a header whose counts and digest agree with it: a file only its content
    can make bad."""
    header = json.loads(lines[0])
    counts = dict.fromkeys(transfer.KINDS, 0)
    for line in lines[1:]:
        kind = re.search(r'"kind": ?"(\w+)"', line)
        if kind and kind.group(1) in counts:
            counts[kind.group(1)] += 1
    header["counts"] = counts
    header["digest"] = "sha256:" + hashlib.sha256("".join(lines[1:]).encode()).hexdigest()
    return [json.dumps(header) + "\n", *lines[1:]]


def everything(repo: Repository) -> list[str]:
    return body(repo.transfer.export(repo.sessions(), "")) if repo.sessions() else []


def test_round_trip_is_exact_across_databases(tmp_path: Path, pg_server: Any) -> None:
    url = pg_server.new_database()
    try:
        with (Repository.open(tmp_path / "a.db") as a, Repository.open(url) as pg,
              Repository.open(tmp_path / "c.db") as c):
            two_requests(a)
            furnish(a)
            first = a.transfer.export(["k1/trip", "k1/trip-b"], "k1/")
            header = json.loads(first[0])
            assert header["format"] == "flowstate-session" and header["version"] == transfer.VERSION
            assert header["sessions"] == ["trip", "trip-b"] and header["counts"]["response"] == 2
            assert all("k1/" not in line for line in first[1:])  # names relative to the namespace exported
            assert pg.transfer.load(first, "k2/") == ["trip", "trip-b"]
            second = pg.transfer.export(["k2/trip", "k2/trip-b"], "k2/")
            assert body(second) == body(first)
            c.transfer.load(second, "k1/")
            third = c.transfer.export(["k1/trip", "k1/trip-b"], "k1/")
            assert body(third) == body(first)
            # what the rest of FlowState reads of it is the original's
            assert pg.lineage.forked_from("k2/trip-b") == ("k2/trip", 1)
            assert [n.id for n in pg.nodes("k2/trip-b")] == [n.id for n in a.nodes("k1/trip-b")]
            assert pg.records.transcripts("k2/trip-b")[2].idempotency == {"idem-1": 1}
            assert pg.waiting.get("k2/trip-b") == {"session": "k2/trip-b", "query": "more?", "steps": []}
            stored = pg.responses.get("resp_1", "k2/")
            assert stored is not None and stored.session == "k2/trip" and stored.body["output"] == [1]
            assert pg.conversations.get("k2/trip") == ({"topic": "lisbon"}, 1_790_000_000)
            assert [r.query for r in pg.requests("k2/trip")] == [r.query for r in a.requests("k1/trip")]
            from flowstate.store.search import Search
            hits, _ = pg.catalog.search("k2/", Search.parse("cancellation"))
            before, _ = a.catalog.search("k1/", Search.parse("cancellation"))
            assert {h.state_id for h in hits} == {h.state_id for h in before}
    finally:
        pg_server.drop(url)


def test_the_imported_session_answers_as_the_original(tmp_path: Path) -> None:
    with Repository.open(tmp_path / "a.db") as a, Repository.open(tmp_path / "b.db") as b:
        used = two_requests(a)
        b.transfer.load(a.transfer.export(["k1/trip"], ""), "")
        original, imported = third_prompts(a, used), third_prompts(b, used)
        assert original == imported and len(original) >= 2  # every call of request 3 saw the same prompt
        assert a.node("k1/trip", "dec_keep_a") == b.node("k1/trip", "dec_keep_a")


def test_a_fork_alone_carries_what_it_shares(tmp_path: Path) -> None:
    with Repository.open(tmp_path / "a.db") as a, Repository.open(tmp_path / "b.db") as b:
        two_requests(a)
        furnish(a)
        alone = a.transfer.export(["k1/trip-b"], "k1/")
        assert json.loads(alone[1])["forked_from"] is None
        b.transfer.load(alone, "k1/")
        assert b.lineage.forked_from("k1/trip-b") is None and b.sessions() == ["k1/trip-b"]
        assert [(r.index, r.query) for r in b.requests("k1/trip-b")] == [(r.index, r.query) for r in
                                                                           a.requests("k1/trip-b")]
        assert sorted(n.id for n in b.nodes("k1/trip-b")) == sorted(n.id for n in a.nodes("k1/trip-b"))
        assert body(b.transfer.export(["k1/trip-b"], "k1/")) == body(alone)


def _edit(kind: str, change: Callable[[dict[str, Any]], None]) -> Callable[[list[str]], list[str]]:
    def edited(lines: list[str]) -> list[str]:
        out = list(lines)
        for i, line in enumerate(out[1:], 1):
            obj = json.loads(line)
            if obj["kind"] == kind:
                change(obj)
                out[i] = json.dumps(obj) + "\n"
                return sealed(out)
        raise AssertionError(kind)
    return edited


def _header(change: Callable[[dict[str, Any]], None]) -> Callable[[list[str]], list[str]]:
    def edited(lines: list[str]) -> list[str]:
        header = json.loads(lines[0])
        change(header)
        return [json.dumps(header) + "\n", *lines[1:]]
    return edited


def _duplicate_node(lines: list[str]) -> list[str]:
    node = next(line for line in lines[1:] if json.loads(line)["kind"] == "node")
    return sealed([*lines, node])


def _relation_to(target: str) -> Callable[[list[str]], list[str]]:
    return _edit("relation", lambda r: r.update(target=target))


BAD: dict[str, tuple[Callable[[list[str]], list[str]], str]] = {
    "empty": (lambda lines: [], "empty"),
    "not a session file": (lambda lines: ['{"hello": 1}\n'], "not a FlowState session file"),
    "truncated": (lambda lines: lines[:-3], "truncated"),
    "cut mid-line": (lambda lines: [*lines[:-1], lines[-1][:20]], "truncated"),
    "edited": (lambda lines: [lines[0], *(line.replace("Lisbon", "Porto") for line in lines[1:])], "sha256"),
    "newer format": (_header(lambda h: h.update(version=transfer.VERSION + 1)), "newer than this FlowState"),
    "unknown format version": (_header(lambda h: h.update(version=0)), "not one this FlowState reads"),
    "huge body declared": (_header(lambda h: h["counts"].update(node=10**6)), "at most"),
    "huge body undeclared": (lambda lines: [*lines, *(lines[-1:] * 2000)], "more lines than its header counts"),
    "ids that collide": (_duplicate_node, "appears twice"),
    "relation to a missing node": (_relation_to("no_such_node"), "no node of the session"),
    "fork without its parent": (lambda lines: sealed([lines[0], *(
        line for line in lines[1:] if json.loads(line)["session" if json.loads(line)["kind"] != "session" else "name"]
        != "trip")]), "does not hold before it"),
    "unknown kind": (lambda lines: sealed([lines[0], '{"kind": "secret", "session": "trip"}\n', *lines[1:]]),
                     "line 2: unknown kind"),
    "extra field": (_edit("request", lambda r: r.update(admin=True)), "unknown field(s) admin"),
    "wrong type": (_edit("node", lambda n: n.update(request="1")), "wrong type"),
    "request out of order": (_edit("request", lambda r: r.update(index=5)), "out of order"),
    "unknown relation": (_edit("relation", lambda r: r.update(rel="owns")), "unknown relation"),
    "deep nesting": (lambda lines: sealed([x.replace('"value":', '"value":' + "[" * 5000 + "0" + "]" * 5000 + ',"v":',
                                                     1)
                                           if '"kind":"node"' in x else x for x in lines]), "nests deeper"),
    "not json": (lambda lines: [lines[0], "{not json\n", *lines[2:]], "line 2 is not JSON"),
    # the rest of the cases docs/operations.md lists (a --rename, a line too long: below)
    "missing field": (_edit("request", lambda r: r.pop("strategy")), "missing field(s) strategy"),
    "row before its session": (lambda lines: sealed([lines[0], lines[2], lines[1], *lines[3:]]),
                               "has no session line before it"),
    "two sessions of one name": (lambda lines: sealed([*lines, lines[1]]), "appears twice"),
    "node of a request it lacks": (_edit("node", lambda n: n.update(request=99)), "belongs to request 99"),
    "unknown node type": (_edit("node", lambda n: n.update(type="opinion")), "unknown kind or type"),
    "fork sharing more than its parent": (lambda lines: sealed([x.replace('{"requests":1,', '{"requests":9,').replace(
        '"index":2,', '"index":10,' if '"session":"trip-b"' in x else '"index":2,') for x in lines]),
        "shares 9 requests of 'trip'"),
    "bad feedback": (lambda lines: sealed([*lines, '{"at":1,"comment":"","key":"","kind":"feedback","label":null,'
                                                   '"request":1,"score":3,"session":"trip"}\n']), "score is a number"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_file_is_refused_and_changes_nothing(any_repo: Repository, tmp_path: Path, case: str) -> None:
    with Repository.open(tmp_path / "source.db") as source:
        two_requests(source, "trip")
        furnish_plain(source)
        good = source.transfer.export(["trip", "trip-b"], "")
    any_repo.persist_request("other", 1, "q", "r", [], {"steps": []})
    before = everything(any_repo)
    make, message = BAD[case]
    with pytest.raises(BadSessionFile, match=message.replace("(", r"\(").replace(")", r"\)")):
        any_repo.transfer.load(make(good), "")
    assert everything(any_repo) == before and any_repo.sessions() == ["other"]


def furnish_plain(repo: Repository) -> None:
    """A fork of ``trip`` (no namespace) whose new state supersedes a shared one."""
    repo.lineage.fork("trip", 1, "trip-b")
    repo.persist_request("trip-b", 2, "Switch to B", "Switched.", [
        Node(id="dec_switch_b", type=StateType.JUDGEMENT, summary="Switch to hotel B", value={"hotel": "B"},
             refs=(Ref(rel=Relation.SUPERSEDES, state_id="dec_book_a"),), request=2)], {"steps": []})


def test_a_fork_cannot_reach_past_what_it_shares(tmp_path: Path) -> None:
    with Repository.open(tmp_path / "a.db") as a, Repository.open(tmp_path / "b.db") as b:
        two_requests(a, "trip")
        furnish_plain(a)
        lines = a.transfer.export(["trip", "trip-b"], "")
        late = next(json.loads(x)["id"] for x in lines[1:] if json.loads(x)["kind"] == "node"
                    and json.loads(x)["session"] == "trip" and json.loads(x)["request"] == 2)
        hostile = [x if '"dec_switch_b"' not in x or '"relation"' not in x else x.replace('"dec_book_a"', f'"{late}"')
                   for x in lines]
        with pytest.raises(BadSessionFile, match="no node of the session or of what it shares"):
            b.transfer.load(sealed(hostile), "")
        assert b.sessions() == []


def test_taken_names_and_ids(any_repo: Repository, tmp_path: Path) -> None:
    with Repository.open(tmp_path / "source.db") as source:
        two_requests(source, "trip")
        furnish_plain(source)
        source.responses.save(StoredResponse("resp_x", "", "trip", 0, {"id": "resp_x"}, []), 1_790_000_000)
        lines = source.transfer.export(["trip", "trip-b"], "")
    assert any_repo.transfer.load(lines, "") == ["trip", "trip-b"]
    before = everything(any_repo)
    with pytest.raises(SessionExists, match="'trip'.*--rename"):
        any_repo.transfer.load(lines, "")
    with pytest.raises(BadSessionFile, match="response 'resp_x' already exists"):  # ids are global: refused whole
        any_repo.transfer.load(lines, "", {"trip": "trip-2", "trip-b": "trip-b-2"})
    assert everything(any_repo) == before
    with pytest.raises(BadSessionFile, match="does not hold: nope"):
        any_repo.transfer.load(lines, "", {"nope": "x"})
    no_response = sealed([x for x in lines if '"kind":"response"' not in x])
    assert any_repo.transfer.load(no_response, "", {"trip": "trip-2", "trip-b": "trip-b-2"}) == ["trip-2", "trip-b-2"]
    assert any_repo.lineage.forked_from("trip-b-2") == ("trip-2", 1)  # a renamed parent: its fork follows it


def test_a_failure_mid_write_rolls_back(any_repo: Repository, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with Repository.open(tmp_path / "source.db") as source:
        two_requests(source, "trip")
        furnish_plain(source)
        lines = source.transfer.export(["trip", "trip-b"], "")
    real = transfer._write_session
    calls = []

    def failing(*args: Any) -> None:
        calls.append(args[1].name)
        if len(calls) == 2:
            raise RuntimeError("the disk went away")
        real(*args)

    monkeypatch.setattr(transfer, "_write_session", failing)
    with pytest.raises(RuntimeError):
        any_repo.transfer.load(lines, "")
    assert calls == ["trip", "trip-b"] and any_repo.sessions() == []
    from flowstate.store.search import Search
    assert any_repo.catalog.search("", Search.parse("hotel"))[0] == []  # the index rows went with the transaction


def test_a_rename_of_no_session_and_a_line_too_long_are_refused(any_repo: Repository, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    with Repository.open(tmp_path / "source.db") as source:
        two_requests(source, "trip")
        good = source.transfer.export(["trip"], "")
    before = everything(any_repo)
    with pytest.raises(BadSessionFile, match="--rename names session\\(s\\) the file does not hold: nope"):
        any_repo.transfer.load(good, "", rename={"nope": "x"})
    monkeypatch.setattr(transfer, "MAX_LINE_CHARS", 200)
    with pytest.raises(BadSessionFile, match="is longer than 200 characters"):
        any_repo.transfer.load(good, "")
    assert everything(any_repo) == before
