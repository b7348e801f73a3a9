"""An engine given as one value: ``NAME[:MODEL][@URL][,KEY=VALUE…]``.

``openai:Qwen/Qwen3.5-27B@http://gpu1:8000/v1,temperature=0.1`` is the ``openai`` backend serving that model
at that URL; ``llamacpp`` alone is the embedded model; ``scripted:outputs.jsonl`` replays a script. Further
URLs continue the list (``@http://a/v1,http://b/v1``: calls routed by session over both servers). The
head may also be written as pairs (``engine=openai,model=M,base-url=URL``). ``vllm.KEY=VALUE`` passes any
vLLM engine argument and ``chat-template.KEY=VALUE`` a chat-template variable (values read as JSON when they
parse). ``flowstate eval --engine``, ``--user`` and ``--judge`` take this form.
"""

from __future__ import annotations

import json
from typing import Any

from engine.errors import EngineConfigError

KEYS = {"engine": "name", "model": "model", "base-url": "base_url", "preset": "preset", "dtype": "dtype",
        "temperature": "temperature", "top-p": "top_p", "max-tokens": "max_tokens", "script": "script",
        "api-key": "api_key", "max-model-len": "max_model_len", "tensor-parallel-size": "tensor_parallel_size",
        "gpu-memory-utilization": "gpu_memory_utilization", "speculate": "speculate", "cache-salt": "cache_salt",
        "session-header": "session_header", "priority": "priority", "prompt-cache-key": "prompt_cache_key",
        "scheduling": "scheduling"}
NUMBERS = {"temperature": float, "top_p": float, "max_tokens": int, "max_model_len": int, "tensor_parallel_size": int,
           "gpu_memory_utilization": float}
# KEY prefix -> the option holding a dict of them
NESTED = {"vllm.": "engine_args", "chat-template.": "chat_template_kwargs"}
# the backend whose MODEL position names a script rather than a model
SCRIPTED = "scripted"


def parse(text: str, option: str = "--engine") -> dict[str, Any]:
    """The engine options a spec names (the keys of ``engine.load``); a clear error naming ``option``."""
    items = [i.strip() for i in text.split(",") if i.strip()]
    if not items:
        raise EngineConfigError(f"{option} needs an engine, e.g. llamacpp or openai:MODEL@URL")
    out: dict[str, Any] = {} if "=" in items[0] else _head(items.pop(0))
    for item in items:
        if item.startswith(("http://", "https://")) and "base_url" in out:
            out["base_url"] += "," + item  # one more server
            continue
        _pair(out, item, text, option)
    if "name" not in out:
        raise EngineConfigError(f"{option} needs a backend name first (NAME[:MODEL][@URL]), not {text!r}")
    return out


def label(opts: dict[str, Any]) -> str:
    """A short name of an engine's options: ``NAME:MODEL`` (a run's identity and a campaign's folder)."""
    return f"{opts['name']}:{opts.get('model') or opts.get('script') or 'default'}"


def _head(head: str) -> dict[str, Any]:
    """``NAME[:MODEL][@URL]``."""
    name, _, rest = head.partition(":")
    if rest.startswith("//"):  # NAME@URL with no model: the colon was the URL's
        name, rest = head.partition("@")[0], "@" + head.partition("@")[2]
    model, at, url = rest.partition("@")
    out: dict[str, Any] = {"name": name.strip()}
    if model.strip():
        out["script" if out["name"] == SCRIPTED else "model"] = model.strip()
    if at and url.strip():
        out["base_url"] = url.strip()
    return out


def _pair(out: dict[str, Any], item: str, text: str, option: str) -> None:
    key, eq, value = (part.strip() for part in item.partition("="))
    nested = next((p for p in NESTED if key.startswith(p) and len(key) > len(p)), None)
    if not eq or (key not in KEYS and nested is None):
        raise EngineConfigError(f"{option} takes NAME[:MODEL][@URL] then KEY=VALUE pairs ({', '.join(KEYS)}, "
                                f"vllm.ARG, chat-template.VAR), not {item!r} in {text!r}")
    if nested is not None:
        try:
            parsed: Any = json.loads(value)
        except json.JSONDecodeError:
            parsed = value
        out.setdefault(NESTED[nested], {})[key[len(nested):].replace("-", "_")] = parsed
        return
    name = KEYS[key]
    try:
        out[name] = NUMBERS[name](value) if name in NUMBERS else value
    except ValueError as exc:
        raise EngineConfigError(f"{option}: {key} takes a number, not {value!r}") from exc
