"""Erasure at the store: a subject found by its session's name, a conversation's metadata and a stored response's
``user``, with every fork; all of it removed in one transaction on both databases; nothing of another subject or
another tenant's subject of the same name touched; a receipt that keeps no erased content and checks out; and on
SQLite, the raw database file and its write-ahead log hold none of the erased text afterwards."""

from __future__ import annotations

import hashlib
from pathlib import Path

from flowstate import Repository
from flowstate.nodes import Node, StateType, canonical_json
from flowstate.store.audit import Entry
from flowstate.store.backends import is_postgres
from flowstate.store.erasure import subject_digest
from flowstate.store.repository import Transcript
from flowstate.store.responses import StoredResponse
from flowstate.store.search import Search

SECRET = "quokkazebra"  # the subject's text: in states, records and their parts, transcripts, responses, the index


def _said(repo: Repository, session: str, text: str) -> None:
    k = repo.request_count(session) + 1
    node = Node(id=f"kn_{k}", type=StateType.KNOWLEDGE, summary=f"told {text}", value={"said": text}, request=k)
    policy = f"The user said {text}. " + "Be brief. " * 40  # long: a part of the record (flowstate/store/parts.py)
    repo.persist_request(session, k, f"remember {text}", f"noted {text}", [node], {"query": text, "policy": policy},
                         transcript=Transcript([{"role": "user", "content": f"remember {text}"},
                                                {"role": "assistant", "content": f"noted {text}"}], {f"idem-{k}": 1}))


def _subject(repo: Repository, ns: str = "") -> None:
    """Alice in ``ns``: her session and its fork, a conversation whose metadata names her, a session a stored
    response names as its user, and a request of hers waiting on tool results."""
    _said(repo, ns + "alice", f"{SECRET} one")
    _said(repo, ns + "alice", f"{SECRET} two")
    repo.lineage.fork(ns + "alice", 1, ns + "alice-branch")
    _said(repo, ns + "alice-branch", f"{SECRET} branch")
    repo.conversations.save(ns + "conv_1", {"user_id": "alice"}, 1)
    _said(repo, ns + "conv_1", f"{SECRET} conversation")
    _said(repo, ns + "trip-9", f"{SECRET} trip")
    rid = "resp_a" + ns.replace("/", "")
    repo.responses.save(StoredResponse(rid, ns, ns + "trip-9", 2, {"id": rid, "user": "alice",
                                                                  "output_text": f"{SECRET} response"}, []), 5)
    repo.waiting.save(ns + "alice", 3, {"said": SECRET})


def _raw_bytes(path: Path) -> bytes:
    return b"".join(p.read_bytes() for p in (path, Path(f"{path}-wal")) if p.exists())


def test_a_subject_and_everything_that_names_it_goes_and_nothing_else(any_repo: Repository, db_target: str) -> None:
    repo = any_repo
    tenant = repo.tenants.create_tenant("other").id
    _subject(repo)
    _subject(repo, f"{tenant}/")  # another tenant's alice: untouched
    _said(repo, "bob", "bob stays")
    assert sorted(repo.erasure.sessions_of("", "alice")) == ["alice", "alice-branch", "conv_1", "trip-9"]
    if not is_postgres(db_target):
        assert SECRET.encode() in _raw_bytes(Path(db_target))  # the check below can fail

    receipt = repo.erasure.erase("", "alice", Entry("subject.erase", "", "shell"))
    assert receipt.removed == {"sessions": 4, "requests": 5, "states": 5, "observations": 0, "relations": 0,
                               "transcripts": 5, "idempotency_keys": 5, "conversations": 1, "waiting_requests": 1,
                               "responses": 1, "vault_values_elsewhere": 0}
    assert repo.sessions() == [f"{tenant}/{n}" for n in ("alice", "alice-branch", "conv_1", "trip-9")] + ["bob"]
    assert repo.responses.get("resp_a", "") is None and repo.responses.get(f"resp_a{tenant}", f"{tenant}/") is not None
    assert repo.waiting.get("alice") is None and repo.waiting.get(f"{tenant}/alice") is not None
    assert len(repo.catalog.search(f"{tenant}/", Search.parse(SECRET))[0]) == 5
    assert all(h.session.startswith(f"{tenant}/") for h in repo.catalog.search("", Search.parse(SECRET))[0])
    assert not any(SECRET in line for line in repo.transfer.export(["bob"]))

    storage = repo.erasure.scrub()
    kept = repo.erasure.keep_storage(receipt, storage)
    assert repo.erasure.receipt(receipt.id, None) == kept and repo.erasure.receipt(receipt.id, tenant) is None
    assert "alice" not in str(kept.to_dict()) and SECRET not in str(kept.to_dict())
    assert kept.subject_sha256 == subject_digest("alice", kept.salt)  # whoever knows the subject can check it
    body = {k: v for k, v in kept.to_dict().items() if k not in ("object", "digest", "storage")}
    assert kept.digest == hashlib.sha256(canonical_json(body).encode()).hexdigest()
    assert any("exports" in note for note in storage)
    entries, _ = repo.audit.entries(action="subject.erase")
    assert [e.target for e in entries] == ["sha256:" + kept.subject_sha256[:16]]
    assert entries[0].detail["receipt"] == kept.id and "alice" not in str(entries[0].detail)
    if is_postgres(db_target):
        assert any("VACUUM" in note and "GIN" in note for note in storage)
        return
    assert any("secure_delete" in note for note in storage)  # the other tenant's alice keeps the text on disk here


def test_the_receipt_lists_the_sessions_left_that_mention_the_subject(any_repo: Repository) -> None:
    """A support agent's session that names Alice stays (it is not hers), and the receipt says so: which session,
    how many requests and states name her — never what they say; another tenant's are not looked at."""
    repo = any_repo
    tenant = repo.tenants.create_tenant("other").id
    _subject(repo)
    _said(repo, "support-7", "ALICE asked for a refund")  # any case
    _said(repo, "support-7", "nothing about her")
    _said(repo, f"{tenant}/support-9", "alice again")
    _said(repo, "bob", "bob stays")
    receipt = repo.erasure.erase("", "alice")
    assert receipt.mentions == [{"session": "support-7", "requests": 1, "nodes": 1}]
    assert "support-7" in repo.sessions()  # reported, not removed
    shown = receipt.to_dict()
    assert shown["mentions"] == receipt.mentions and "refund" not in str(shown)
    body = {k: v for k, v in shown.items() if k not in ("object", "digest", "storage")}
    assert receipt.digest == hashlib.sha256(canonical_json(body).encode()).hexdigest()  # the digest covers them
    assert repo.erasure.erase("", "nobody").mentions == []


def test_on_sqlite_the_file_holds_no_erased_text(repo: Repository, db_path: Path) -> None:
    _subject(repo)
    _said(repo, "bob", "bob stays")
    repo.erasure.erase("", "alice")
    assert "write-ahead log checkpointed and truncated" in repo.erasure.scrub()[0]
    raw = _raw_bytes(db_path)
    assert SECRET.encode() not in raw and b"bob stays" in raw
    assert not Path(f"{db_path}-wal").exists() or Path(f"{db_path}-wal").stat().st_size == 0


def test_erasing_a_subject_nothing_names_removes_nothing(repo: Repository) -> None:
    _said(repo, "bob", "bob stays")
    receipt = repo.erasure.erase("", "nobody")
    assert set(receipt.removed.values()) == {0} and repo.sessions() == ["bob"]
