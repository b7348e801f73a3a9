"""Chat Completions responses as typed wire models: a completion, its stream of chunks, usage, and
FlowState's extension field (which OpenAI clients ignore)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel

from engine.base import Usage
from serving.chat.messages import AssistantMessage, Delta
from serving.errors import APIError
from serving.turns import TurnResult

log = logging.getLogger("flowstate.serving")
KEEPALIVE_S = 10.0  # an SSE comment while internal steps run, so proxies keep the stream open


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class UsageOut(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails

    @classmethod
    def of(cls, usage: Usage) -> UsageOut:
        return cls(prompt_tokens=usage.prompt_tokens, completion_tokens=usage.completion_tokens,
                   total_tokens=usage.prompt_tokens + usage.completion_tokens,
                   prompt_tokens_details=PromptTokensDetails(cached_tokens=usage.cached_tokens))


class Choice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: str
    logprobs: None = None


class _Envelope(BaseModel):
    id: str
    object: str
    created: int
    model: str


class Completion(_Envelope):
    object: str = "chat.completion"
    choices: list[Choice]
    usage: UsageOut
    flowstate: dict[str, Any]


class ChunkChoice(BaseModel):
    index: int = 0
    delta: Delta
    finish_reason: str | None = None
    logprobs: None = None


class Chunk(_Envelope):
    object: str = "chat.completion.chunk"
    choices: list[ChunkChoice]
    usage: UsageOut | None = None
    flowstate: dict[str, Any] | None = None

    def sse(self) -> str:
        body = self.model_dump(mode="json", exclude_none=True)
        body["choices"] = [{**c, "finish_reason": c.get("finish_reason"), "logprobs": None} for c in body["choices"]]
        return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


def extension(result: TurnResult, base: dict[str, Any]) -> dict[str, Any]:
    """FlowState's detail of the turn, in a field OpenAI clients ignore."""
    return {
        **base, "request": result.request, "request_finished": result.finished, "model_calls": len(result.steps),
        "unfinished": result.unfinished,
        "steps": [
            {"index": s.index, "decision": s.decision,
             "committed": [f"{op['operation']} {op['state_id']}" for op in s.committed],
             "disclosed": s.disclosed, "rejected": s.rejected + s.refused + s.malformed,
             **({"protocol_error": s.protocol_error} if s.protocol_error else {}),
             **({"truncated": True} if s.truncated else {})}  # cut at the completion budget
            for s in result.steps
        ],
        "disclosed": [i for s in result.steps for i in s.disclosed],
        "rejected": [r for s in result.steps for r in (*s.rejected, *s.refused, *s.malformed)],
    }


def completion(completion_id: str, model: str, result: TurnResult, base: dict[str, Any]) -> dict[str, Any]:
    body = Completion(
        id=completion_id, created=int(time.time()), model=model,
        choices=[Choice(message=result.message, finish_reason=result.finish_reason)],
        usage=UsageOut.of(result.usage), flowstate=extension(result, base),
    )
    return body.model_dump(mode="json")


def replayed(
    completion_id: str, model: str, message: AssistantMessage, base: dict[str, Any], streamed: bool,
) -> JSONResponse | StreamingResponse:
    """The answer an earlier identical request already got (nothing was run again; usage is zero)."""
    ext = {**base, "replayed": True}
    if not streamed:
        body = Completion(id=completion_id, created=int(time.time()), model=model,
                          choices=[Choice(message=message, finish_reason=message.finish_reason)],
                          usage=UsageOut.of(Usage()),
                          flowstate=ext)
        return JSONResponse(body.model_dump(mode="json"))

    async def chunks() -> AsyncIterator[str]:
        created = int(time.time())
        for delta, end in ((Delta(role="assistant", content=""), None), (message.delta(), None),
                           (Delta(), message.finish_reason)):
            yield Chunk(id=completion_id, created=created, model=model,
                        choices=[ChunkChoice(delta=delta, finish_reason=end)],
                        flowstate=ext if end else None).sse()
        yield "data: [DONE]\n\n"

    return StreamingResponse(chunks(), media_type="text/event-stream")


async def turn_deltas(task: asyncio.Future[Any], deltas: asyncio.Queue[Delta] | None) -> AsyncIterator[Delta | None]:
    """What a running turn streams: its deltas as they come while ``task`` runs (None when a keep-alive is due: none
    came for KEEPALIVE_S), then those still queued when it ends."""
    while not task.done():
        waiting: set[asyncio.Future[Any]] = {task}
        getter = asyncio.ensure_future(deltas.get()) if deltas is not None else None
        if getter is not None:
            waiting.add(getter)
        done, _ = await asyncio.wait(waiting, timeout=KEEPALIVE_S, return_when=asyncio.FIRST_COMPLETED)
        if getter is not None and getter in done:
            yield getter.result()
            continue
        if getter is not None:
            getter.cancel()
        if not task.done():
            yield None
    while deltas is not None and not deltas.empty():
        yield deltas.get_nowait()


async def stream(
    completion_id: str, model: str, task: asyncio.Task[TurnResult], base: dict[str, Any], include_usage: bool,
    deltas: asyncio.Queue[Delta] | None = None,
) -> AsyncIterator[str]:
    """The turn as SSE: the role, the answer's text and the client's tool calls as they are decoded
    (``deltas``), then what the turn ends with."""
    created = int(time.time())
    sent: list[str] = []
    tools_streamed = False

    def chunk(delta: Delta | None, finish: str | None = None, **extra: Any) -> str:
        choices = [] if delta is None else [ChunkChoice(delta=delta, finish_reason=finish)]
        return Chunk(id=completion_id, created=created, model=model, choices=choices, **extra).sse()

    yield chunk(Delta(role="assistant", content=""))
    async for delta in turn_deltas(task, deltas):
        if delta is None:
            yield ": keep-alive\n\n"
            continue
        sent.append(delta.content or "")
        tools_streamed = tools_streamed or delta.tool_calls is not None
        yield chunk(delta)
    try:
        result = task.result()
    except APIError as exc:
        yield f"data: {json.dumps(exc.body())}\n\n"
        return
    except Exception as exc:  # a bug or a storage fault: the stream says so and ends
        log.exception("internal error in a streamed turn")
        error = APIError(500, f"internal error: {type(exc).__name__}", type="server_error")
        yield f"data: {json.dumps(error.body())}\n\n"
        return
    content, streamed = result.message.content or "", "".join(sent)
    if result.message.tool_calls:
        if not tools_streamed:
            yield chunk(result.message.delta())
    elif content.startswith(streamed) and len(content) > len(streamed):
        yield chunk(Delta(content=content[len(streamed):]))  # what was not streamed (all of it, for most engines)
    elif not content.startswith(streamed):
        log.warning("a streamed answer differs from the final one (%d vs %d characters)", len(streamed), len(content))
    yield chunk(Delta(), result.finish_reason, flowstate=extension(result, base))
    if include_usage:
        yield chunk(None, usage=UsageOut.of(result.usage))
    yield "data: [DONE]\n\n"
