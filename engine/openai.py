"""The OpenAI-compatible backend: any server speaking Chat Completions (e.g. ``vllm serve``).

The grammar travels as ``extra_body={"structured_outputs": {"grammar": ...}}``, the way vLLM
(>= 0.12) takes it. Responses are streamed so time to first token is measured; usage, including
``prompt_tokens_details.cached_tokens``, is read from the final chunk (vLLM reports cached tokens
when started with ``--enable-prompt-tokens-details``). Connection errors, timeouts, 429 and 5xx
are retried with exponential backoff; other 4xx answers are configuration errors.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit

from engine.base import ALL_SAMPLING, Capabilities, Decoding, Generation, Message, OnText, RemoteEngine, Sampling, Usage
from engine.chat import check_options
from engine.errors import ContextOverflow, EngineConfigError, EngineError, EngineUnavailable
from engine.purpose import STEP, Purpose

OVERFLOW = re.compile(r"maximum context length|context length|longer than the maximum model length|"
                      r"context_length_exceeded|exceeds the context", re.I)
"""How servers say a prompt does not fit the context (vLLM, OpenAI, llama.cpp's server) in a 400's detail."""


class OpenAIEngine(RemoteEngine):
    name = "openai"
    capabilities = Capabilities(grammar=True, streams=True, sampling=ALL_SAMPLING)
    options = frozenset({"base_url", "api_key", "model", "temperature", "top_p", "max_tokens", "retries", "backoff_s",
                         "timeout_s", "chat_template_kwargs", "cache_salt", "session_header", "priority",
                         "prompt_cache_key"})

    def __init__(
        self,
        base_url: str | None = None,
        *,
        api_key: str | None = None,
        model: str | None = None,
        temperature: float = 0.0,
        top_p: float = 1.0,
        max_tokens: int = 1024,
        retries: int = 3,
        backoff_s: float = 0.5,
        timeout_s: float = 300.0,
        chat_template_kwargs: dict[str, Any] | None = None,
        cache_salt: str = "auto",
        session_header: str = "x-session-id",
        priority: str = "auto",
        prompt_cache_key: str = "auto",
    ) -> None:
        """``cache_salt``, ``priority`` and ``prompt_cache_key`` say whether a call carries vLLM's ``cache_salt``,
        vLLM's ``priority`` and OpenAI's ``prompt_cache_key``: ``on``, ``off``, or ``auto`` — the first two to a vLLM
        server (its ``/v1/models`` says ``owned_by: vllm``), the key to OpenAI's own API (``api.openai.com``): no server
        is sent a field it may refuse. ``session_header`` names the header carrying the session's routing id (""
        none)."""
        if not base_url:
            raise EngineConfigError("the openai engine needs --base-url, e.g. http://127.0.0.1:8000/v1")
        import openai

        self._openai = openai
        self.base_url = base_url
        self.client = openai.OpenAI(base_url=base_url, api_key=api_key or "EMPTY", max_retries=0, timeout=timeout_s)
        self.decoding, self.max_tokens = Decoding(temperature, top_p), max_tokens
        self.retries, self.backoff_s = retries, backoff_s
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.session_header = session_header  # the header a router in front of the servers keeps a session by
        for what, value in (("cache_salt", cache_salt), ("priority", priority), ("prompt_cache_key", prompt_cache_key)):
            if value not in ("auto", "on", "off"):
                raise EngineConfigError(f"{what} is auto, on or off, not {value!r}")
        listed = self._call(self.client.models.list) if model is None else None
        self._auto = (cache_salt == "auto", priority == "auto")
        self.model = self.model_name = model or self._first_model(listed)
        openai_own = urlsplit(base_url).hostname == "api.openai.com"
        self.cache_key = prompt_cache_key == "on" or prompt_cache_key == "auto" and openai_own
        self.capabilities = Capabilities(grammar=True, streams=True, sampling=ALL_SAMPLING, salts=cache_salt == "on",
                                         priority=priority == "on", known=not any(self._auto))
        if not self.capabilities.known:
            self._read_kind(listed)

    def _read_kind(self, listed: Any = None) -> None:
        """Whether the server is vLLM's (its ``/v1/models`` says ``owned_by: vllm``), for the options left ``auto``:
        read at start, or — a server not up yet (a vLLM still loading its model) — at the first call it answers;
        never taken for "not vLLM" meanwhile (a vLLM server would otherwise never get a tenant's cache salt): a call
        while it has not answered fails as the server being unreachable."""
        if listed is None:
            o = self._openai
            try:
                listed = self.client.with_options(timeout=10.0).models.list()
            except (o.APIConnectionError, o.APITimeoutError):
                return  # not up yet: asked again at the next call
            except o.APIStatusError as exc:
                if exc.status_code in (500, 502, 503, 504):  # failing, or a proxy whose server is not up yet
                    return
                listed = None  # it answered without a model list (a 404, a 501): not a vLLM server
        vllm = any(getattr(m, "owned_by", "") == "vllm" for m in getattr(listed, "data", []) or [])
        salts_auto, priority_auto = self._auto
        self.capabilities = replace(self.capabilities, known=True,
                                    salts=self.capabilities.salts or salts_auto and vllm,
                                    priority=self.capabilities.priority or priority_auto and vllm)

    @classmethod
    def from_options(cls, **options: Any) -> Any:
        """One server, or — for ``base_url="URL1,URL2,…"`` — a session-affine router over several."""
        given = check_options(cls.name, options, set(cls.options))
        urls = [u.strip() for u in str(given.get("base_url") or "").split(",") if u.strip()]
        if len(urls) <= 1:
            return cls(**given)
        from engine.router import RouterEngine

        first = cls(**{**given, "base_url": urls[0], "retries": given.get("retries", 1)})
        rest = [cls(**{**given, "base_url": u, "model": first.model, "retries": given.get("retries", 1)})
                for u in urls[1:]]
        return RouterEngine([first, *rest])

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Run a client call with retries on transient faults; classify what remains."""
        o = self._openai
        for attempt in range(self.retries + 1):
            try:
                return fn(*args, **kwargs)
            except (o.APIConnectionError, o.APITimeoutError, o.RateLimitError, o.InternalServerError) as exc:
                if attempt == self.retries:
                    what = "unreachable" if isinstance(exc, o.APIConnectionError) else "failing"
                    raise EngineUnavailable(f"server {self.base_url} {what} after {self.retries + 1} tries: "
                                            f"{exc}") from exc
                time.sleep(self.backoff_s * 2**attempt)
            except o.APIStatusError as exc:
                detail = _detail(exc)
                if exc.status_code == 400 and OVERFLOW.search(detail):  # vLLM's, OpenAI's words for it
                    raise ContextOverflow(f"server {self.base_url}: the prompt does not fit the model's context: "
                                          f"{detail}") from exc
                raise EngineConfigError(f"server {self.base_url} refused the request ({exc.status_code}): "
                                        f"{detail}") from exc
        raise AssertionError("unreachable")

    def embed(self, texts: list[str]) -> list[list[float]]:
        """The server's ``/v1/embeddings`` of ``texts``, in their order (an embedding model's server)."""
        reply = self._call(self.client.embeddings.create, model=self.model, input=texts)
        return [list(d.embedding) for d in sorted(reply.data, key=lambda d: d.index)]

    def _first_model(self, models: Any = None) -> str:
        models = models if models is not None else self._call(self.client.models.list)
        if not models.data:
            raise EngineConfigError(f"server {self.base_url} serves no model; name one with --model")
        return str(models.data[0].id)

    def _extras(self, grammar: str | None, cache_salt: str | None, affinity: str | None,
                priority: int = 0) -> tuple[dict[str, Any], dict[str, str]]:
        """A call's body beyond OpenAI's fields, and its headers."""
        extra: dict[str, Any] = {}
        if grammar:  # vLLM would otherwise let JSON whitespace run free inside the grammar's %json blocks
            extra["structured_outputs"] = {"grammar": grammar, "disable_any_whitespace": True}
        if self.chat_template_kwargs:  # vLLM (and SGLang) pass these to the chat template
            extra["chat_template_kwargs"] = self.chat_template_kwargs
        if cache_salt and self.capabilities.salts:  # vLLM folds it into the first KV block's hash
            extra["cache_salt"] = cache_salt
        if priority and self.capabilities.priority:  # vLLM's scheduling order (--scheduling-policy priority)
            extra["priority"] = priority
        if affinity and self.cache_key:  # OpenAI's cache routing by key: a session's calls meet its cached prefix
            extra["prompt_cache_key"] = affinity
        headers = _trace_headers()
        if affinity and self.session_header:  # what a router in front of several servers keeps a session by
            headers[self.session_header] = affinity
        return extra, headers

    def count_tokens(self, text: str) -> int:
        """Exact through vLLM's /tokenize when the server has it, else an estimate (4 characters a token)."""
        try:
            root = self.base_url.rstrip("/").removesuffix("/v1")
            resp = self.client._client.post(f"{root}/tokenize", json={"model": self.model, "prompt": text})
            if resp.status_code == 200:
                return int(resp.json()["count"])
        except Exception:
            pass
        return max(1, len(text) // 4)

    def generate(self, messages: Sequence[Message], *, grammar: str | None = None, max_tokens: int | None = None,
                 on_text: OnText | None = None, sampling: Sampling | None = None,
                 affinity: str | None = None, purpose: Purpose = STEP,
                 cache_salt: str | None = None, priority: int = 0) -> Generation:
        s = (sampling or Sampling()).over(self.decoding)
        if not self.capabilities.known:
            self._read_kind()
            if not self.capabilities.known:  # no call goes out unsalted to a server that may be vLLM's
                raise EngineUnavailable(f"server {self.base_url} unreachable: it has not said what kind of server "
                                        "it is (its /v1/models), which decides the cache salt and priority")
        started = time.perf_counter()
        extra, headers = self._extras(grammar, cache_salt, affinity, priority)
        stream = self._call(
            self.client.chat.completions.create,
            model=self.model,
            messages=[{"role": m.role, "content": m.content} for m in messages],
            temperature=s.temperature, top_p=s.top_p, **({"seed": s.seed} if s.seed is not None else {}),
            max_tokens=max_tokens or self.max_tokens,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=extra or None,
            extra_headers=headers or None,
        )
        parts: list[str] = []
        first: float | None = None
        usage: Any = None
        finish = "stop"
        try:
            for chunk in stream:
                if chunk.usage is not None:
                    usage = chunk.usage
                for choice in chunk.choices:
                    finish = choice.finish_reason or finish
                    if choice.delta.content:
                        first = first or time.perf_counter()
                        parts.append(choice.delta.content)
                        if on_text is not None:
                            on_text(choice.delta.content)
        except self._openai.APIError as exc:
            # vLLM validates the grammar after the stream has started and reports it as an error event
            if "grammar" in str(exc).lower():
                raise EngineConfigError(f"server {self.base_url} refused the request (grammar): {exc}") from exc
            raise EngineError(f"server {self.base_url} broke off the response: {exc}", retryable=True) from exc
        end = time.perf_counter()
        first = first or end
        details = getattr(usage, "prompt_tokens_details", None)
        return Generation(
            text="".join(parts),
            usage=Usage(
                prompt_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
                cached_tokens=int(getattr(details, "cached_tokens", 0) or 0),
                completion_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
                ttft_s=first - started,
                decode_s=end - first,
            ),
            finish_reason=finish,
        )


def _trace_headers() -> dict[str, str]:
    """The W3C trace context (``traceparent``) of the model call's span while FlowState traces, so that the server's
    own spans (vLLM's ``--otlp-traces-endpoint``) join the trace; nothing, and no import, while it does not."""
    if "opentelemetry.propagate" not in sys.modules:
        return {}
    from opentelemetry import propagate

    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier


def _detail(exc: Any) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        message = body.get("message") or (body.get("error") or {}).get("message")
        if message:
            return str(message)[:500]
    return str(exc)[:500]
