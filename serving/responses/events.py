"""A response as Server-Sent Events, in the order OpenAI's server sends them: ``response.created`` and
``response.in_progress``; each output item added, its text or arguments as they are decoded, done; then
``response.completed`` (or ``response.incomplete``, or ``response.failed`` with an error code). Every event's data
carries its ``type`` and an increasing ``sequence_number``; item ids are the final response's."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any, Literal

from pydantic import BaseModel

from serving.chat.completions import turn_deltas
from serving.chat.messages import Delta
from serving.errors import APIError
from serving.responses.objects import Draft, call_item, message_item, text_part

log = logging.getLogger("flowstate.serving")


class ResponseEventOut(BaseModel):
    """The response as it stands: created, in progress, and how it ended."""

    type: Literal["response.created", "response.in_progress", "response.completed", "response.incomplete",
                  "response.failed"]
    response: dict[str, Any]


class OutputItemEventOut(BaseModel):
    type: Literal["response.output_item.added", "response.output_item.done"]
    output_index: int
    item: dict[str, Any]


class ContentPartEventOut(BaseModel):
    type: Literal["response.content_part.added", "response.content_part.done"]
    item_id: str
    output_index: int
    content_index: int
    part: dict[str, Any]


class TextDeltaEventOut(BaseModel):
    type: Literal["response.output_text.delta"] = "response.output_text.delta"
    item_id: str
    output_index: int
    content_index: int
    delta: str
    logprobs: list[Any] = []


class TextDoneEventOut(BaseModel):
    type: Literal["response.output_text.done"] = "response.output_text.done"
    item_id: str
    output_index: int
    content_index: int
    text: str
    logprobs: list[Any] = []


class ArgumentsDeltaEventOut(BaseModel):
    type: Literal["response.function_call_arguments.delta"] = "response.function_call_arguments.delta"
    item_id: str
    output_index: int
    delta: str


class ArgumentsDoneEventOut(BaseModel):
    type: Literal["response.function_call_arguments.done"] = "response.function_call_arguments.done"
    item_id: str
    output_index: int
    arguments: str


class Events:
    """The events of one response's output items, numbered; at most one item is open at a time."""

    def __init__(self, draft: Draft) -> None:
        self.draft = draft
        self.seq = 0
        self.index = -1  # the open item's output_index
        self.open: dict[str, Any] | None = None  # the open item as the final output will hold it
        self.calls: dict[int, str] = {}  # a stream delta's call index -> call_id
        self.sent: dict[str, dict[str, Any]] = {}  # item id -> the item as its done event gave it

    def event(self, event: BaseModel) -> str:
        """The event as the stream sends it, numbered next."""
        body = {**event.model_dump(), "sequence_number": self.seq}
        self.seq += 1
        return f"event: {body['type']}\ndata: {json.dumps(body, ensure_ascii=False)}\n\n"

    def delta(self, delta: Delta) -> list[str]:
        out: list[str] = []
        if delta.content:
            if self.open is None or self.open["type"] != "message":
                out += self.close() + self.start(message_item(self.draft.ids.message, "", "in_progress"))
            out += self.text(delta.content)
        for call in delta.tool_calls or ():
            if call.id is not None and call.function is not None and call.function.name is not None:
                self.calls[call.index] = call.id
                item = call_item(self.draft.ids.call(call.id), call.id, call.function.name, "", "in_progress")
                out += self.close() + self.start(item)
            arguments = call.function.arguments if call.function is not None else None
            if arguments and self.open is not None and self.open.get("call_id") == self.calls.get(call.index):
                self.open["arguments"] += arguments
                out.append(self.event(ArgumentsDeltaEventOut(item_id=self.open["id"], output_index=self.index,
                                                             delta=arguments)))
        return out

    def start(self, item: dict[str, Any]) -> list[str]:
        self.index += 1
        self.open = {**item, "content": [text_part("")]} if item["type"] == "message" else dict(item)
        out = [self.event(OutputItemEventOut(type="response.output_item.added", output_index=self.index, item=item))]
        if item["type"] == "message":
            out.append(self.event(ContentPartEventOut(type="response.content_part.added", item_id=item["id"],
                                                      output_index=self.index, content_index=0, part=text_part(""))))
        return out

    def text(self, text: str) -> list[str]:
        assert self.open is not None
        self.open["content"][0]["text"] += text
        return [self.event(TextDeltaEventOut(item_id=self.open["id"], output_index=self.index, content_index=0,
                                             delta=text))]

    def close(self, final: dict[str, Any] | None = None) -> list[str]:
        """Done events of the open item; ``final`` is what the response holds of it (text, arguments, status)."""
        item, self.open = self.open, None
        if item is None:
            return []
        item = {**item, "status": "completed", **(final or {})}
        at = {"item_id": item["id"], "output_index": self.index}
        out: list[str] = []
        if item["type"] == "message":
            part = item["content"][0]
            out = [self.event(TextDoneEventOut(**at, content_index=0, text=part["text"])),
                   self.event(ContentPartEventOut(type="response.content_part.done", **at, content_index=0, part=part))]
        elif item["type"] == "function_call":
            out = [self.event(ArgumentsDoneEventOut(**at, arguments=item["arguments"]))]
        self.sent[item["id"]] = item
        return out + [self.event(OutputItemEventOut(type="response.output_item.done", output_index=self.index,
                                                    item=item))]

    def finish(self, output: list[dict[str, Any]]) -> list[str]:
        """The final output's items: the open one (and those streamed before it) closed with their final content,
        the items not streamed (server-side MCP calls among them) sent whole."""
        out: list[str] = []
        for item in output:
            if self.open is not None and self.open["id"] == item["id"]:
                if item["type"] == "message":
                    streamed, final = self.open["content"][0]["text"], item["content"][0]["text"]
                    if final.startswith(streamed) and len(final) > len(streamed):
                        out += self.text(final[len(streamed):])
                    elif not final.startswith(streamed):
                        log.warning("a streamed answer differs from the final one (%d vs %d characters)",
                                    len(streamed), len(final))
                out += self.close(item)
            elif item["id"] not in self.sent:
                out += self.close()
                if item["type"] == "message":
                    out += self.start(message_item(item["id"], "", "in_progress")) + self.text(
                        item["content"][0]["text"])
                elif item["type"] == "function_call":
                    out += self.start({**item, "arguments": "", "status": "in_progress"})
                    if item["arguments"]:
                        out.append(self.event(ArgumentsDeltaEventOut(item_id=item["id"], output_index=self.index,
                                                                     delta=item["arguments"])))
                else:
                    out += self.start(item)
                out += self.close(item)
        return out + self.close()


async def stream(draft: Draft, finishing: asyncio.Task[dict[str, Any]],
                 deltas: asyncio.Queue[Delta] | None) -> AsyncIterator[str]:
    """The response's events while its turn runs (``finishing`` gives the final response object)."""
    events = Events(draft)
    start = draft.object("in_progress")
    yield events.event(ResponseEventOut(type="response.created", response=start))
    yield events.event(ResponseEventOut(type="response.in_progress", response=start))
    async for delta in turn_deltas(finishing, deltas):
        if delta is None:
            yield ": keep-alive\n\n"
            continue
        for text in events.delta(delta):
            yield text
    try:
        final = finishing.result()
    except APIError as exc:
        for text in events.close():
            yield text
        error = {"code": exc.code or exc.type, "message": exc.message}
        yield events.event(ResponseEventOut(type="response.failed",
                                            response=draft.object("failed", list(events.sent.values()), error=error)))
        return
    except Exception as exc:  # a bug or a storage fault: the stream says so and ends
        log.exception("internal error in a streamed response")
        error = {"code": "server_error", "message": f"internal error: {type(exc).__name__}"}
        yield events.event(ResponseEventOut(type="response.failed",
                                            response=draft.object("failed", list(events.sent.values()), error=error)))
        return
    for text in events.finish(final["output"]):
        yield text
    kind: Literal["response.incomplete", "response.completed"] = \
        "response.incomplete" if final["status"] == "incomplete" else "response.completed"
    yield events.event(ResponseEventOut(type=kind, response=final))
