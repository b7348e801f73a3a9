"""Model backends behind one small Protocol, chosen by name; heavy imports stay inside each backend."""

from __future__ import annotations

import importlib
from typing import Any

from engine.base import Engine, Generation, Message, Usage
from engine.errors import EngineConfigError, EngineError

# name -> "module:factory"; imported only when that backend is asked for.
BACKENDS: dict[str, str] = {
    "scripted": "engine.scripted:ScriptedEngine.from_options",
    "transformers": "engine.transformers:TransformersEngine.from_options",
    "vllm": "engine.vllm:VLLMEngine.from_options",
    "openai": "engine.openai:OpenAIEngine.from_options",
}
DEFAULT = "transformers"


def load(name: str, **options: Any) -> Engine:
    """Build the backend called ``name`` with its options (unknown names list the valid ones).

    Options set to None are dropped, so callers can pass every command-line option through.
    """
    target = BACKENDS.get(name)
    if target is None:
        valid = ", ".join(sorted(BACKENDS))
        raise EngineConfigError(f"unknown engine {name!r}; valid engines: {valid}")
    module_name, _, attr_path = target.partition(":")
    obj: Any = importlib.import_module(module_name)
    for attr in attr_path.split("."):
        obj = getattr(obj, attr)
    engine: Engine = obj(**{k: v for k, v in options.items() if v is not None})
    return engine


__all__ = ["BACKENDS", "DEFAULT", "Engine", "EngineConfigError", "EngineError", "Generation", "Message", "Usage", "load"]
