"""Engine calls carry a prefix-cache salt derived on the server: one per tenant (the same for a tenant's every
session and call, different between tenants, none on an open server), one per session, or none; a header a client
sends never sets it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest
from fastapi.testclient import TestClient

from engine.scripted import ScriptedEngine
from flowstate import Repository
from serving.app import create_app
from serving.services import ServerConfig
from serving.tenancy import cache_salts
from tests.helpers import output


def _served(isolation: str, keys: tuple[str, ...] = ()) -> Iterator[tuple[Any, ScriptedEngine]]:
    engine = ScriptedEngine([output(content="ok")] * 20)
    with Repository.open(":memory:") as repo:
        app = create_app(ServerConfig(engine=engine, repo=repo, keys=keys, cache_isolation=isolation))
        with TestClient(app, base_url="http://flowstate.test") as http:
            def ask(key: str, session: str) -> None:
                api = openai.OpenAI(base_url="http://flowstate.test/v1", api_key=key, http_client=http, max_retries=0)
                api.chat.completions.create(model="flowstate", user=session,
                                            messages=[{"role": "user", "content": "q"}],
                                            extra_body={"cache_salt": "chosen-by-the-client"})
            yield ask, engine


@pytest.mark.parametrize("isolation", ["tenant", "session", "off"])
def test_each_call_is_salted_as_the_server_says(isolation: str) -> None:
    for ask, engine in _served(isolation, keys=("key-a", "key-b")):
        ask("key-a", "one")
        ask("key-a", "two")
        ask("key-b", "one")
        a1, a2, b1 = engine.salts
        if isolation == "off":
            assert engine.salts == [None, None, None]
        elif isolation == "tenant":
            assert a1 == a2 != b1 and len(a1 or "") == 43 and set(a1 or "") - set("/@\\") == set(a1 or "")
        else:
            assert len({a1, a2, b1}) == 3 and None not in (a1, a2, b1)
        assert "chosen-by-the-client" not in engine.salts  # never a value the client sends


def test_an_open_server_is_one_tenant_and_salts_nothing_per_tenant() -> None:
    for ask, engine in _served("tenant"):
        ask("none", "one")
        ask("none", "two")
        assert engine.salts == [None, None]


def test_salts_are_keyed_by_the_servers_secret() -> None:
    one, two = cache_salts("tenant", b"1" * 32), cache_salts("tenant", b"2" * 32)
    assert one("t1/s") == one("t1/other") != one("t2/s") and one("t1/s") != two("t1/s")
    with pytest.raises(ValueError, match="cache isolation is one of"):
        cache_salts("everyone", b"x")


def test_tenants_sharing_a_cache_are_told_no_more_than_the_system_prompt_was_cached() -> None:
    """With isolation off on a server of several tenants, the cache is shared, but what a tenant is told of it never
    counts another tenant's prefix past the system prompt everyone sends; isolated, each is told its own hits."""
    told: dict[str, list[int]] = {}
    for isolation in ("off", "tenant"):
        engine = ScriptedEngine([output(content="ok")] * 4)
        with Repository.open(":memory:") as repo:
            app = create_app(ServerConfig(engine=engine, repo=repo, keys=("key-a", "key-b"), cache_isolation=isolation))
            with TestClient(app, base_url="http://flowstate.test") as http:
                system = app.state.services.turns.agent.system_prompt()
                told[isolation] = []
                for key in ("key-a", "key-b", "key-b"):
                    api = openai.OpenAI(base_url="http://flowstate.test/v1", api_key=key, http_client=http,
                                        max_retries=0)
                    reply = api.chat.completions.create(model="flowstate", user="one", messages=[
                        {"role": "user", "content": "my account number is 4921 and my name is Ada"}])
                    told[isolation].append(reply.usage.prompt_tokens_details.cached_tokens)
    shared = ScriptedEngine([]).count_tokens(system)
    assert told["off"][1] == told["off"][2] == shared  # b sent a's very prompt: told the system prompt, no more
    assert told["tenant"][1] == 0 and told["tenant"][2] > shared  # isolated: nothing of a's; b's own hits in full
