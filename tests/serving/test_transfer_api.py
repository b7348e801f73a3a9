"""Sessions moved over HTTP and by the CLI, through a real server on both databases: a key exports its session,
another key imports it into its own namespace and goes on with it; taken names, bad files and other keys' sessions
are refused with the database as it was."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
from click.testing import CliRunner

from flowstate.cli import main
from tests.helpers import add, output
from tests.serving.conftest import BOTH_DATABASES, Server, lines
from tests.serving.test_chat import client

ONE = {"Authorization": "Bearer key-one"}
TWO = {"Authorization": "Bearer key-two"}


def script() -> list[dict[str, Any]]:
    out = lines("[trip]", [output(delta=[add("pref_quiet", "preference", note="quiet rooms in Lisbon")],
                                  content="Noted.")])
    out += lines("[more]", [output(focus=["pref_quiet"]),
                            output(delta=[add("dec_hotel", "judgement", refs=[("supports", "pref_quiet")])],
                                   content="The Baixa.")])
    return out


@BOTH_DATABASES
def test_export_import_over_http_and_go_on(server: Server) -> None:
    url = server.start(script(), "--api-key", "key-one", "--api-key", "key-two")
    client(url, "key-one").chat.completions.create(model="flowstate", user="trip",
                                                   messages=[{"role": "user", "content": "[trip] a quiet hotel"}])
    exported = httpx.get(f"{url}/sessions/trip/export", headers=ONE, timeout=30)
    assert exported.status_code == 200 and exported.headers["content-type"].startswith("application/x-ndjson")
    assert 'filename="trip.flowstate.jsonl"' in exported.headers["content-disposition"]
    file = exported.text
    assert json.loads(file.split("\n")[0])["sessions"] == ["trip"]
    assert httpx.get(f"{url}/sessions/trip/export", headers=TWO, timeout=30).status_code == 404  # not key two's
    assert httpx.get(f"{url}/sessions/nobody/export", headers=ONE, timeout=30).status_code == 404

    imported = httpx.post(f"{url}/sessions/import", headers=TWO, content=file, timeout=30)
    assert imported.status_code == 200 and imported.json() == {"object": "session.import", "sessions": ["trip"]}
    theirs = httpx.get(f"{url}/sessions/trip", headers=TWO, timeout=30).json()
    assert [n["id"] for n in theirs["nodes"]] == ["pref_quiet"]
    again = httpx.post(f"{url}/sessions/import", headers=TWO, content=file, timeout=30)
    assert again.status_code == 409 and again.json()["error"]["code"] == "session_exists"
    renamed = httpx.post(f"{url}/sessions/import", headers=TWO, params={"rename": "trip=trip-copy"}, content=file,
                         timeout=30)
    assert renamed.json()["sessions"] == ["trip-copy"]
    # key two goes on with its copy: the next request is its second, and it sees the imported state
    client(url, "key-two").chat.completions.create(model="flowstate", user="trip-copy",
                                                   messages=[{"role": "user", "content": "[more] which one?"}])
    copy = httpx.get(f"{url}/sessions/trip-copy", headers=TWO, timeout=30).json()
    assert len(copy["requests"]) == 2 and "dec_hotel" in [n["id"] for n in copy["nodes"]]
    assert len(httpx.get(f"{url}/sessions/trip", headers=ONE, timeout=30).json()["requests"]) == 1

    listed = lambda: httpx.get(f"{url}/sessions", headers=TWO, timeout=30).json()["data"]  # noqa: E731
    before = listed()
    for bad, code in ((file.replace("quiet", "noisy"), "invalid_session_file"), ("", "invalid_session_file"),
                      (file[: len(file) // 2], "invalid_session_file"), (b"\xff\xfe", "invalid_session_file")):
        r = httpx.post(f"{url}/sessions/import", headers=TWO, params={"rename": "trip=other"}, content=bad, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["code"] == code, r.text
    for params in ({"rename": "nonsense"}, {"bogus": "1"}, {"rename": "trip=a/b"}):
        r = httpx.post(f"{url}/sessions/import", headers=TWO, params=params, content=file, timeout=30)
        assert r.status_code == 400, (params, r.text)
    assert httpx.post(f"{url}/sessions/import", content=file, timeout=30).status_code == 401
    assert listed() == before


@BOTH_DATABASES
def test_the_cli_moves_a_key_s_sessions(server: Server, tmp_path: Path) -> None:
    url = server.start(script(), "--api-key", "key-one")
    client(url, "key-one").chat.completions.create(model="flowstate", user="trip",
                                                   messages=[{"role": "user", "content": "[trip] a quiet hotel"}])
    server.stop()
    out = tmp_path / "trip.jsonl"
    done = CliRunner().invoke(main, ["export", "--db", str(server.db), "--all", "--api-key", "key-one",
                                     "--out", str(out)])
    assert done.exit_code == 0, done.output
    target = tmp_path / "moved.db"
    into = CliRunner().invoke(main, ["import", str(out), "--db", str(target), "--api-key", "key-one"])
    assert into.exit_code == 0 and "imported 1 session(s): trip" in into.output, into.output
    back = tmp_path / "back.jsonl"
    assert CliRunner().invoke(main, ["export", "--db", str(target), "--session", "trip", "--api-key", "key-one",
                                     "--out", str(back)]).exit_code == 0
    assert back.read_text().split("\n")[1:] == out.read_text().split("\n")[1:]  # the same file, but for its header
    taken = CliRunner().invoke(main, ["import", str(out), "--db", str(target), "--api-key", "key-one"])
    assert taken.exit_code == 1 and "--rename" in taken.output
    assert CliRunner().invoke(main, ["export", "--db", str(target), "--out", str(back)]).exit_code != 0  # neither
    bad = CliRunner().invoke(main, ["import", str(out), "--db", str(target), "--rename", "trip"])
    assert bad.exit_code != 0 and "OLD=NEW" in bad.output
