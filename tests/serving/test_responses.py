"""The Responses API against a real uvicorn server with the official openai client (scripted engine): create,
stream (the SDK's strict accumulator), retrieve, input items, delete, function-call round trips with
``previous_response_id`` and with the whole history resent, ``conversation``, structured output, bad input."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from pydantic import BaseModel

from tests.flowstate.test_request_options import json_answer
from tests.helpers import add, output
from tests.serving.conftest import Server, lines
from tests.serving.test_chat import client, round_trip_script

PRICE_TOOL: Any = {
    "type": "function", "name": "get_price", "description": "Price per night of a hotel.", "strict": True,
    "parameters": {"type": "object", "properties": {"hotel": {"type": "string"}}, "required": ["hotel"],
                   "additionalProperties": False},
}


round_trip = round_trip_script  # request 1: a client tool call, a state-only step, an answer; request 2: memory


def answer_call(response: Any) -> list[dict[str, Any]]:
    """The function_call_output items answering a response's function calls."""
    calls = [item for item in response.output if item.type == "function_call"]
    assert calls, response.output
    return [{"type": "function_call_output", "call_id": c.call_id,
             "output": json.dumps({"price": 120, **json.loads(c.arguments)})} for c in calls]


def test_create_retrieve_input_items_delete(server: Server) -> None:
    api = client(server.start(lines("[r1]", [output(content="Hello, Ada.")])))
    r = api.responses.create(model="flowstate", input="[r1] Say hello to Ada.", instructions="Be brief.",
                             metadata={"run": "7"})
    assert r.id.startswith("resp_") and r.object == "response" and r.status == "completed"
    assert r.output_text == "Hello, Ada." and r.output[0].id.startswith("msg_")
    assert r.instructions == "Be brief." and r.metadata == {"run": "7"} and r.store is True
    assert r.usage.input_tokens > 0 and r.usage.output_tokens > 0 and r.usage.input_tokens_details.cached_tokens >= 0
    again = api.responses.retrieve(r.id)
    assert again.id == r.id and again.output_text == "Hello, Ada." and again.output[0].id == r.output[0].id
    items = list(api.responses.input_items.list(r.id, limit=1))  # auto-paging: one item a page
    assert [(i.type, i.role, i.content[0].text) for i in items] == [("message", "user", "[r1] Say hello to Ada.")]
    assert items[0].id.startswith("msg_")
    api.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        api.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError):
        api.responses.delete(r.id)
    # the response is gone; what its request taught the session is not
    assert api.get("/sessions", cast_to=object)["data"][0]["requests"] == 1


def test_function_call_round_trip_with_previous_response_id(server: Server) -> None:
    api = client(server.start(round_trip("[r2]")))
    first = api.responses.create(model="flowstate", input="[r2] What does hotel A cost?", tools=[PRICE_TOOL])
    (call,) = first.output
    assert call.type == "function_call" and call.name == "get_price" and json.loads(call.arguments) == {"hotel": "A"}
    assert call.id.startswith("fc_") and call.call_id == "call_obs_r1_s1_1"
    answer = api.responses.create(model="flowstate", previous_response_id=first.id, input=answer_call(first),
                                  tools=[PRICE_TOOL])
    assert answer.output_text == "Hotel A costs 120 per night." and answer.previous_response_id == first.id
    # a new request in the same session: FlowState's memory answers it (a disclosed state, no tool call)
    later = api.responses.create(model="flowstate", previous_response_id=answer.id,
                                 input="[r2] Remind me: what did hotel A cost?", tools=[PRICE_TOOL])
    assert later.output_text == "It cost 120 per night."
    assert later.model_extra["flowstate"]["disclosed"] == ["price_a"]
    session = later.model_extra["flowstate"]["session"]
    assert api.get(f"/sessions/{session}", cast_to=object)["requests"][1]["response"] == "It cost 120 per night."
    # an earlier response that ended in function calls of a request later turns finished: no fork starts mid-request
    with pytest.raises(openai.BadRequestError, match="a fork starts at the end of a completed response") as refused:
        api.responses.create(model="flowstate", previous_response_id=first.id, input="[r2] again")
    assert refused.value.code == "previous_response_not_latest"


def test_an_earlier_response_forks_its_session_sharing_what_came_before(server: Server) -> None:
    """Continuing a response that later turns went on from forks the session there: the fork shares the requests up
    to that response (their states and relations, not copied), runs on its own, and the original is untouched."""
    api = client(server.start(lines("[r9]", [
        output(tools=[{"name": "get_price", "arguments": {"hotel": "A"}}]),
        output(delta=[add("price_a", refs=[("supports", "obs_r1_s1_1")], hotel="A", price=120)]),
        output(content="Hotel A costs 120 per night."),
        output(delta=[add("booked_a", "judgement", refs=[("derives", "price_a")], hotel="A")]),
        output(content="Booked A."),
        output(delta=[add("booked_b", "judgement", refs=[("derives", "price_a")], hotel="B")]),  # the fork's
        output(content="Booked B."),
        output(focus=["booked_b"]),
        output(content="You booked B."),
    ])))
    first = api.responses.create(model="flowstate", input="[r9] What does hotel A cost?", tools=[PRICE_TOOL])
    priced = api.responses.create(model="flowstate", previous_response_id=first.id, input=answer_call(first),
                                  tools=[PRICE_TOOL])
    booked = api.responses.create(model="flowstate", previous_response_id=priced.id, input="[r9] Book it.")
    original = booked.model_extra["flowstate"]["session"]
    fork_call: dict[str, Any] = {"model": "flowstate", "previous_response_id": priced.id,
                                 "input": "[r9] Book hotel B instead.", "extra_headers": {"Idempotency-Key": "fork-1"}}
    fork = api.responses.create(**fork_call)
    assert fork.output_text == "Booked B." and fork.previous_response_id == priced.id
    forked = fork.model_extra["flowstate"]["session"]
    assert forked != original and fork.model_extra["flowstate"]["request"] == 2
    again = api.responses.create(**fork_call)  # a retry under its key: the same fork, the same answer, run once
    assert again.output_text == "Booked B." and again.model_extra["flowstate"]["session"] == forked
    later = api.responses.create(model="flowstate", previous_response_id=fork.id, input="[r9] Which did I book?")
    assert later.output_text == "You booked B." and later.model_extra["flowstate"]["disclosed"] == ["booked_b"]
    mine = api.get(f"/sessions/{forked}", cast_to=object)
    theirs = api.get(f"/sessions/{original}", cast_to=object)
    assert [r["query"] for r in mine["requests"]] == ["[r9] What does hotel A cost?", "[r9] Book hotel B instead.",
                                                     "[r9] Which did I book?"]
    assert [r["query"] for r in theirs["requests"]] == ["[r9] What does hotel A cost?", "[r9] Book it."]
    assert mine["forked_from"] == {"session": original, "requests": 1} and theirs["forked_from"] is None
    states = {n["id"] for n in mine["nodes"] if n["kind"] == "state"}
    assert states == {"price_a", "booked_b"} and "booked_a" not in states
    # the fork's states live in its own session; the shared one is the original's row, not a copy
    with pytest.raises(openai.ConflictError, match="fork"):
        api.delete(f"/sessions/{original}", cast_to=object)
    api.delete(f"/sessions/{forked}", cast_to=object)
    api.delete(f"/sessions/{original}", cast_to=object)
    with pytest.raises(openai.NotFoundError):
        api.responses.create(model="flowstate", previous_response_id=fork.id, input="[r9] gone?")


def test_a_fork_whose_first_turn_fails_leaves_no_session_behind(server: Server) -> None:
    """The fork is made before its first turn runs; when that turn fails (here the engine has no output left), the
    empty fork is dropped again, and a retry under the same key forks anew and runs."""
    from flowstate import Repository

    script = lines("[r9]", [output(content="A costs 120."), output(content="Booked A.")])
    api = client(server.start(script))
    first = api.responses.create(model="flowstate", input="[r9] What does hotel A cost?")
    api.responses.create(model="flowstate", previous_response_id=first.id, input="[r9] Book it.")
    with Repository.open(server.db) as repo:
        before = repo.sessions()
    fork_call: dict[str, Any] = {"model": "flowstate", "previous_response_id": first.id,
                                 "input": "[r9] Book B instead.", "extra_headers": {"Idempotency-Key": "fork-x"}}
    with pytest.raises(openai.APIStatusError, match="exhausted"):
        api.responses.create(**fork_call)
    with Repository.open(server.db) as repo:
        assert repo.sessions() == before and len(before) == 1
    server.stop()
    api = client(server.start(lines("[r9]", [output(content="Booked B.")])))  # a restart: its script anew
    fork = api.responses.create(**fork_call)
    assert fork.output_text == "Booked B." and fork.model_extra["flowstate"]["session"] != before[0]


def test_function_call_round_trip_with_the_whole_history_resent(server: Server) -> None:
    """A client that keeps no server state (the Agents SDK's default, Codex): it resends everything, echoed items
    with their ids included; the server recognises the history and runs only what is new."""
    api = client(server.start(round_trip("[r3]")))
    history: list[Any] = [{"role": "user", "content": "[r3] What does hotel A cost?"}]
    first = api.responses.create(model="flowstate", input=history, tools=[PRICE_TOOL], store=False)
    history += [item.model_dump(exclude_none=True) for item in first.output] + answer_call(first)
    answer = api.responses.create(model="flowstate", input=history, tools=[PRICE_TOOL], store=False)
    assert answer.output_text == "Hotel A costs 120 per night."
    assert answer.model_extra["flowstate"]["session"] == first.model_extra["flowstate"]["session"]
    history += [item.model_dump(exclude_none=True) for item in answer.output]
    history.append({"role": "user", "content": "[r3] Remind me: what did hotel A cost?"})
    later = api.responses.create(model="flowstate", input=history, tools=[PRICE_TOOL], store=False)
    assert later.output_text == "It cost 120 per night." and later.model_extra["flowstate"]["request"] == 2
    with pytest.raises(openai.NotFoundError):  # store: false leaves nothing retrievable
        api.responses.retrieve(later.id)


def test_streamed_events_in_order_and_the_strict_accumulator(server: Server) -> None:
    api = client(server.start(round_trip("[r4]")))
    events = list(api.responses.create(model="flowstate", input="[r4] What does hotel A cost?", tools=[PRICE_TOOL],
                                       stream=True))
    kinds = [e.type for e in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds[-3:] == ["response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    added, done, completed = events[2].item, events[-2].item, events[-1].response
    assert (added.id == done.id == completed.output[0].id
            and added.call_id == done.call_id == completed.output[0].call_id)
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert json.loads(args) == json.loads(done.arguments) == {"hotel": "A"}
    # the SDK's strict helper: identities checked across added, done and completed
    with api.responses.stream(model="flowstate", previous_response_id=completed.id, input=answer_call(completed),
                              tools=[PRICE_TOOL]) as stream:
        texts = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(texts) == final.output_text == "Hotel A costs 120 per night."
    assert api.responses.retrieve(final.id).output[0].id == final.output[0].id


def test_conversation_names_the_session(server: Server) -> None:
    api = client(server.start(round_trip("[r5]")))
    first = api.responses.create(model="flowstate", conversation="trip-5", input="[r5] What does hotel A cost?",
                                 tools=[PRICE_TOOL])
    assert first.conversation.id == "trip-5"
    api.responses.create(model="flowstate", conversation={"id": "trip-5"}, input=answer_call(first), tools=[PRICE_TOOL])
    later = api.responses.create(model="flowstate", conversation="trip-5",
                                 input="[r5] Remind me: what did hotel A cost?")
    assert later.output_text == "It cost 120 per night."
    assert [r["response"] for r in api.get("/sessions/trip-5", cast_to=object)["requests"]] == [
        "Hotel A costs 120 per night.", "It cost 120 per night."]


def test_structured_output_parses_into_the_model(server: Server) -> None:
    class Price(BaseModel):
        hotel: str
        price: int

    api = client(server.start(lines("[r6]", [json_answer({"hotel": "A", "price": 120})])))
    parsed = api.responses.parse(model="flowstate", input="[r6] Price of A as JSON", text_format=Price)
    assert parsed.output_parsed == Price(hotel="A", price=120)


def test_bad_input_is_an_openai_error_and_nothing_is_stored(server: Server) -> None:
    url = server.start(lines("[r7]", [output(content="ok")]))
    api = client(url)
    with pytest.raises(openai.NotFoundError) as e:
        api.responses.create(model="flowstate", input="[r7] hi", previous_response_id="resp_unknown")
    assert e.value.code == "previous_response_not_found"
    with pytest.raises(openai.BadRequestError, match="cannot be used together"):
        api.responses.create(model="flowstate", input="[r7] hi", previous_response_id="resp_x", conversation="c")
    with pytest.raises(openai.BadRequestError, match="background response is stored"):
        api.responses.create(model="flowstate", input="[r7] hi", background=True, store=False)
    with pytest.raises(openai.BadRequestError, match="only text parts"):
        api.responses.create(model="flowstate", input=[{"role": "user", "content": [
            {"type": "input_image", "image_url": "http://x/y.png"}]}])
    with pytest.raises(openai.BadRequestError, match="function_call.call_id: Field required"):
        api.responses.create(model="flowstate", input=[{"type": "function_call", "name": "f", "arguments": "{}"},
                                                       {"role": "user", "content": "[r7] hi"}])
    big = httpx.post(url + "/responses", content=b'{"model": "flowstate", "input": "' + b"x" * (9 << 20) + b'"}')
    assert big.status_code == 413 and big.json()["error"]["code"] == "body_too_large"
    with pytest.raises(openai.NotFoundError, match="resp_x"):  # cancel: an unknown response
        api.responses.cancel("resp_x")
    assert api.get("/sessions", cast_to=object)["data"] == []  # none of them touched a session
    # unknown item types and tools are accepted and left out
    r = api.responses.create(model="flowstate", input=[
        {"type": "reasoning", "id": "rs_1", "summary": []}, {"type": "item_reference", "id": "msg_0"},
        {"role": "user", "content": "[r7] hi"}], tools=[{"type": "web_search"}])
    assert r.output_text == "ok"


def test_a_failure_after_the_stream_began_is_response_failed(server: Server) -> None:
    # the engine's script runs out after one output that breaks the protocol: the request fails mid-stream
    api = client(server.start(lines("[r8]", ["not the four blocks"]), "--max-protocol-errors", "1"))
    events = list(api.responses.create(model="flowstate", input="[r8] hi", stream=True))
    assert [e.type for e in events][:2] == ["response.created", "response.in_progress"]
    last = events[-1]
    assert last.type == "response.failed" and last.response.status == "failed"
    assert last.response.error.code == "request_failed" and last.response.id == events[0].response.id
    with pytest.raises(openai.NotFoundError):  # a failed response is not stored: nothing to continue from
        api.responses.retrieve(last.response.id)


def test_a_retry_under_its_idempotency_key_gets_the_same_answer_run_once(server: Server) -> None:
    api = client(server.start(lines("[r9]", [output(content="once")])))  # one output: a second run would fail
    first, again = (api.responses.create(model="flowstate", input="[r9] hi", conversation="idem",
                                         extra_headers={"Idempotency-Key": "k-1"}) for _ in range(2))
    assert first.output_text == again.output_text == "once"
    assert again.id == first.id and again.output == first.output  # the same response, not a copy of it
    assert len(api.get("/sessions/idem", cast_to=object)["requests"]) == 1


def test_stored_responses_outlive_a_restart_and_are_per_key(server: Server) -> None:
    script = round_trip("[r10]")
    url = server.start(script, "--api-key", "key-a", "--api-key", "key-b")
    first = client(url, "key-a").responses.create(model="flowstate", input="[r10] What does hotel A cost?",
                                                  tools=[PRICE_TOOL])
    with pytest.raises(openai.NotFoundError):  # another key's responses do not exist for it
        client(url, "key-b").responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError):
        client(url, "key-b").responses.create(model="flowstate", previous_response_id=first.id,
                                              input=answer_call(first), tools=[PRICE_TOOL])
    server.stop()
    url = server.start(script[1:], "--api-key", "key-a", "--api-key", "key-b")  # the same database
    api = client(url, "key-a")
    assert api.responses.retrieve(first.id).output[0].call_id == first.output[0].call_id
    answer = api.responses.create(model="flowstate", previous_response_id=first.id, input=answer_call(first),
                                  tools=[PRICE_TOOL])
    assert answer.output_text == "Hotel A costs 120 per night."


def test_conversations_are_a_view_of_sessions(server: Server) -> None:
    api = client(server.start(round_trip("[r11]")))
    conv = api.conversations.create(metadata={"topic": "hotels"})
    assert conv.id.startswith("conv_") and conv.metadata == {"topic": "hotels"} and conv.created_at > 0
    first = api.responses.create(model="flowstate", conversation=conv.id, input="[r11] What does hotel A cost?",
                                 tools=[PRICE_TOOL])
    api.responses.create(model="flowstate", conversation=conv.id, input=answer_call(first), tools=[PRICE_TOOL])
    items = list(api.conversations.items.list(conv.id, order="asc", limit=2))  # auto-paging, two a page
    assert [i.type for i in items] == ["message", "function_call", "function_call_output", "message"]
    assert items[1].call_id == items[2].call_id == first.output[0].call_id
    assert items[3].content[0].text == "Hotel A costs 120 per night." and len({i.id for i in items}) == 4
    assert api.get(f"/sessions/{conv.id}", cast_to=object)["requests"][0]["response"] == items[3].content[0].text
    assert api.conversations.update(conv.id, metadata={"topic": "lisbon"}).metadata == {"topic": "lisbon"}
    assert api.conversations.retrieve(conv.id).created_at == conv.created_at
    assert api.conversations.delete(conv.id).deleted
    with pytest.raises(openai.NotFoundError):
        api.conversations.retrieve(conv.id)
    with pytest.raises(openai.NotFoundError):  # the session is forgotten, and its responses with it
        api.responses.retrieve(first.id)
    with pytest.raises(openai.BadRequestError, match="items on create"):
        api.conversations.create(items=[{"type": "message", "role": "user", "content": "hi"}])


def test_a_request_ended_without_an_answer_is_incomplete(server: Server) -> None:
    """The step budget reached with the last call cut at its token budget: ``incomplete``, reason
    ``max_output_tokens``, and the stream's terminal event says so; at the budget after whole steps:
    ``max_steps``."""
    cut = {"text": output(delta=[add("note_a", x=1)])[:40], "finish_reason": "length"}
    script = [{"text": output(delta=[add("note_a", x=1)]), "when": "[r12]"}, {**cut, "when": "[r12]"},
              {"text": output(delta=[add("note_b", x=1)]), "when": "[r13]"},
              {"text": output(delta=[add("note_c", x=1)]), "when": "[r13]"}]
    api = client(server.start(script, "--max-steps", "2", "--max-protocol-errors", "3"))
    r = api.responses.create(model="flowstate", input="[r12] Take notes.", max_output_tokens=64)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.max_output_tokens == 64 and "could not finish" in r.output_text
    events = list(api.responses.create(model="flowstate", input="[r13] Take notes.", stream=True))
    assert events[-1].type == "response.incomplete" and events[-1].response.incomplete_details.reason == "max_steps"


def test_max_output_tokens_cuts_the_answer_and_the_response_is_incomplete(server: Server) -> None:
    answer = "Hotel A costs 120 a night and Hotel B costs 95 a night."
    api = client(server.start(lines("[r14]", [output(content=answer)] * 2)))
    whole = api.responses.create(model="flowstate", input="[r14] Which hotel?", max_output_tokens=400)
    assert (whole.status, whole.output_text) == ("completed", answer)
    cut = api.responses.create(model="flowstate", input="[r14] Which hotel, briefly?", max_output_tokens=3)
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"
    assert cut.output_text and answer.startswith(cut.output_text) and len(cut.output_text) < len(answer)
