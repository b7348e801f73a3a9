"""Memory search on both databases (FTS5 on SQLite, PostgreSQL's full-text search): the same hits, kept current by
the writes that persist states, filtered by key, session, type, kind and date, paged by cursor; bad searches are
refused with their reason; a database made before search existed is indexed by its migration."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from flowstate import Repository
from flowstate.nodes import Node, Ref, Relation, StateType
from flowstate.store import search as fts
from flowstate.store.backends import is_postgres
from flowstate.store.migrations import MIGRATIONS, POSTGRES_MIGRATIONS, _statements
from flowstate.store.search import BadSearch, Search


def state(node_id: str, summary: str, value: object, type_: StateType = StateType.KNOWLEDGE, request: int = 1,
          refs: tuple[Ref, ...] = ()) -> Node:
    return Node(id=node_id, type=type_, summary=summary, value=value, refs=refs, request=request)


def observation(node_id: str, text: str, request: int = 1) -> Node:
    return Node(id=node_id, kind="observation", type=StateType.KNOWLEDGE, summary=f"search({text[:20]})",
                value={"tool": "search", "result": text}, request=request)


def fill(repo: Repository) -> None:
    repo.persist_request("ka/alice", 1, "Book a hotel in Lisbon", "Booked A.", [
        observation("obs_r1_s1_1", "Hotel Baixa: cancellation fee $80, breakfast included"),
        state("pref_quiet", "Prefers quiet hotels", {"noise": "quiet", "city": "Lisbon"}, StateType.PREFERENCE),
        state("dec_book_a", "Booked hotel A in Lisbon", {"hotel": "A", "price_usd": 200}, StateType.JUDGEMENT,
              refs=(Ref(rel=Relation.SUPPORTS, state_id="obs_r1_s1_1"),)),
    ], {"steps": []}, strategy="flowstate")
    repo.persist_request("ka/alice", 2, "Is B cheaper now?", "Keep A.", [
        state("dec_keep_a", "Keep hotel A: the switch costs more", {"reason": "cancellation fee"},
              StateType.JUDGEMENT, request=2, refs=(Ref(rel=Relation.SUPERSEDES, state_id="dec_book_a"),)),
    ], {"steps": []})
    repo.persist_request("ka/bob", 1, "Train to Porto", "Done.", [
        state("kn_train", "Train to Porto at 09:00, café car", {"line": "Alfa Pendular"}),
    ], {"steps": []})
    repo.persist_request("kb/carol", 1, "secret", "ok", [state("secret_plan", "Lisbon hotel plan", {"x": 1})],
                         {"steps": []})


def ids(repo: Repository, q: str, namespace: str = "ka/", **filters: str) -> list[str]:
    hits, _ = repo.catalog.search(namespace, Search.parse(q, **filters))
    return [h.state_id for h in hits]


def test_hits_filters_and_keys(any_repo: Repository) -> None:
    fill(any_repo)
    assert sorted(ids(any_repo, "hotel")) == ["dec_book_a", "dec_keep_a", "pref_quiet"]  # never another key's
    assert ids(any_repo, "hotel", namespace="kb/") == ["secret_plan"]
    assert sorted(ids(any_repo, "lisbon hotel")) == ["dec_book_a", "pref_quiet"]  # every word must match; the last
    assert ids(any_repo, "hotel lisbon") == ["dec_book_a"]  # may begin a word ("hotels"), the others are words
    assert ids(any_repo, "quiet hot") == ["pref_quiet"]  # three letters or more
    assert ids(any_repo, "hot quiet") == []
    assert sorted(ids(any_repo, "a")) == ["dec_book_a", "dec_keep_a"]  # a short word only as itself
    assert ids(any_repo, "dec_keep_a") == ["dec_keep_a"]  # an id finds its state
    assert ids(any_repo, "CAFÉ") == ["kn_train"]  # case, any script
    assert ids(any_repo, "cancellation") == ["dec_keep_a"]  # a value's words (the observation is not a state)
    assert sorted(ids(any_repo, "cancellation", in_="states,observations")) == ["dec_keep_a", "obs_r1_s1_1"]
    assert ids(any_repo, "cancellation", in_="observations") == ["obs_r1_s1_1"]
    assert sorted(ids(any_repo, "hotel", type="judgement")) == ["dec_book_a", "dec_keep_a"]
    assert ids(any_repo, "hotel", type="preference,attribute") == ["pref_quiet"]
    assert ids(any_repo, "porto", session="bob") == ["kn_train"]
    assert ids(any_repo, "porto", session="alice") == []
    assert ids(any_repo, "porto", session="carol") == []  # another key's session name: nothing
    assert ids(any_repo, "lisbon", session="nobody") == []
    assert ids(any_repo, "hotel", until="2000-01-01") == []
    assert len(ids(any_repo, "hotel", since="2000-01-01T00:00:00Z")) == 3


def test_hit_fields_and_ranking(any_repo: Repository) -> None:
    fill(any_repo)
    hits, more = any_repo.catalog.search("ka/", Search.parse("lisbon"))
    assert not more
    top = hits[0]
    assert top.state_id in {"dec_book_a", "pref_quiet"}  # the summary's word counts above the value's
    by_id = {h.state_id: h for h in hits}
    keep = any_repo.catalog.search("ka/", Search.parse("keep"))[0][0]
    assert (keep.session, keep.request, keep.type, keep.kind) == ("ka/alice", 2, "judgement", "state")
    assert keep.created is not None and keep.created > 1_700_000_000
    assert by_id["pref_quiet"].summary == "Prefers quiet hotels"
    assert all(h.score > 0 for h in hits)


def test_the_same_hits_on_both_databases(tmp_path: Path, db_target: str) -> None:
    """Whatever the backend, the same words find the same states (the order of equal scores aside)."""
    queries = ["hotel", "lisbon hotel", "hot", "fee", "09", "alfa pendular", "a", "qui", "the switch", "b"]
    with Repository.open(tmp_path / "reference.db") as reference, Repository.open(db_target) as repo:
        for r in (reference, repo):
            fill(r)
        for q in queries:
            for kinds in ("states", "states,observations"):
                assert sorted(ids(repo, q, in_=kinds)) == sorted(ids(reference, q, in_=kinds)), q


def test_pages_by_cursor(any_repo: Repository) -> None:
    nodes = [state(f"s_{i:02d}", f"note number {i} about lisbon", {"i": i}) for i in range(25)]
    any_repo.persist_request("ka/many", 1, "q", "r", nodes, {})
    seen: list[str] = []
    search = Search.parse("lisbon", limit=10)
    while True:
        hits, more = any_repo.catalog.search("ka/", search)
        seen += [h.state_id for h in hits]
        if not more:
            break
        search = Search.parse("lisbon", limit=10, after=search.cursor(search.offset + search.limit))
    assert sorted(seen) == sorted(n.id for n in nodes) and len(seen) == 25
    with pytest.raises(BadSearch, match="another search"):
        Search.parse("porto", after=Search.parse("lisbon").cursor(10))


def test_gone_with_its_session(any_repo: Repository) -> None:
    fill(any_repo)
    assert ids(any_repo, "porto") == ["kn_train"]
    any_repo.delete_session("ka/bob")
    assert ids(any_repo, "porto") == []
    assert sorted(ids(any_repo, "hotel")) == ["dec_book_a", "dec_keep_a", "pref_quiet"]


def test_a_fork_searches_what_it_shares(any_repo: Repository) -> None:
    fill(any_repo)
    any_repo.lineage.fork("ka/alice", 1, "ka/fork_1")
    any_repo.persist_request("ka/fork_1", 2, "Switch to B", "Switched.", [
        state("dec_switch_b", "Switch to hotel B", {"hotel": "B"}, StateType.JUDGEMENT, request=2)], {})
    assert sorted(ids(any_repo, "hotel", session="fork_1")) == ["dec_book_a", "dec_switch_b", "pref_quiet"]
    hit = next(h for h in any_repo.catalog.search("ka/", Search.parse("quiet", session="fork_1"))[0])
    assert hit.session == "ka/alice"  # a shared state is found where it is kept


@pytest.mark.parametrize(("params", "message"), [
    ({"q": ""}, "q is required"),
    ({"q": "   "}, "q is required"),
    ({"q": "x" * 10_000}, "at most 1000"),
    ({"q": '"* - ()'}, "no words"),
    ({"q": " ".join(f"w{i}" for i in range(40))}, "distinct words"),
    ({"q": "a", "type": "feeling"}, "type: unknown 'feeling'"),
    ({"q": "a", "in_": "everything"}, "in: unknown"),
    ({"q": "a", "since": "yesterday"}, "since 'yesterday' is not a date"),
    ({"q": "a", "until": "2026-13-45"}, "until '2026-13-45' is not a date"),
    ({"q": "a", "since": "2026-02-01", "until": "2026-01-01"}, "since is after until"),
    ({"q": "a", "limit": "0"}, "limit is 0"),
    ({"q": "a", "limit": "ten"}, "not a number"),
    ({"q": "a", "after": "%%%"}, "not a cursor"),
    ({"q": "a", "after": "WzEwLCJ4Il0"}, "another search"),
])
def test_bad_searches_say_why(params: dict[str, str], message: str) -> None:
    q = params.pop("q")
    with pytest.raises(BadSearch, match=message):
        Search.parse(q, **params)


@pytest.mark.parametrize("q", ['"hotel', "hotel*", "NEAR(hotel lisbon)", "-hotel", "hotel OR porto", "a & b | !c",
                               "hotel:*", "'); DROP TABLE nodes; --", "hôtel ß 東京"])
def test_query_syntax_is_only_words(any_repo: Repository, q: str) -> None:
    """The databases' query syntax in a query is punctuation or plain words: never an error, never an operator."""
    fill(any_repo)
    hits, _ = any_repo.catalog.search("ka/", Search.parse(q))
    if q in ('"hotel', "hotel*", "-hotel", "hotel:*"):
        assert sorted(h.state_id for h in hits) == ["dec_book_a", "dec_keep_a", "pref_quiet"]
    if q == "hotel OR porto":  # "or" is a word like any other: no state has all three
        assert hits == []
    assert ids(any_repo, "hotel") != []  # the tables are all there


def test_words_and_documents() -> None:
    assert fts.words("Hotel-A's $200 fee; CAFÉ_x 東京") == ["hotel", "a", "s", "200", "fee", "café", "x", "東京"]
    head, body = fts.document("dec_book_a", "Booked A", {"price_usd": 200, "notes": ["line1\nline2"], "none": None})
    assert head == "dec book a booked a"
    assert body == "price usd 200 notes line1 line2 none"
    huge = fts.document("x", "y", {"text": "word " * 100_000})[1]
    assert len(huge) <= fts.MAX_DOCUMENT_CHARS and huge.endswith("word")


def test_the_migration_indexes_an_older_database(db_target: str) -> None:
    """A database made before search (migrations up to 0010) is indexed when it opens, on both backends."""
    rows = ["INSERT INTO sessions (name) VALUES ('old')",
            "INSERT INTO requests (session_id, idx, query, response, record) VALUES (1, 1, 'q', 'r', '{}')",
            "INSERT INTO nodes (session_id, node_id, kind, type, summary, value, request_idx) VALUES"
            " (1, 'kn_old', 'state', 'knowledge', 'An old hotel note', '{\"city\": \"Lisbon\"}', 1)"]
    if is_postgres(db_target):
        import psycopg

        with psycopg.connect(db_target, autocommit=True) as pg:
            pg.execute("CREATE TABLE schema_migrations (name TEXT PRIMARY KEY)")
            for name, sql in POSTGRES_MIGRATIONS[:POSTGRES_MIGRATIONS.index(next(
                    m for m in POSTGRES_MIGRATIONS if m[0] == "0011_search"))]:
                pg.execute(sql)
                pg.execute("INSERT INTO schema_migrations (name) VALUES (%s)", (name,))
            for sql in rows:
                pg.execute(sql)
    else:
        conn = sqlite3.connect(db_target)
        conn.execute("CREATE TABLE schema_migrations (name TEXT PRIMARY KEY)")
        for name, sql in MIGRATIONS:
            if name == "0011_search":
                break
            for statement in _statements(sql):
                conn.execute(statement)
            conn.execute("INSERT INTO schema_migrations (name) VALUES (?)", (name,))
        for sql in rows:
            conn.execute(sql)
        conn.commit()
        conn.close()
    with Repository.open(db_target) as repo:
        hits, _ = repo.catalog.search("", Search.parse("lisbon"))
        assert [(h.session, h.state_id, h.created) for h in hits] == [("old", "kn_old", None)]
        assert ids(repo, "hotel", namespace="", since="2000-01-01") == []  # no time kept: outside any date filter


def test_the_search_bench_fills_and_times(tmp_path: Path) -> None:
    """``flowstate bench search``'s rows: the states it wrote are searchable, and its figures are consistent."""
    from flowstate.bench.search import bench_search, render_table

    rows = bench_search({"sqlite": lambda: str(tmp_path / "bench.db")}, [200], 20)
    row = rows[0]
    assert (row["backend"], row["states"], row["queries"]) == ("sqlite", 200, 20)
    assert row["hits_per_page"] > 0 and 0 < row["p50_ms"] <= row["p99_ms"] <= row["max_ms"]
    assert "| 200 | sqlite | 20 |" in render_table(rows)
