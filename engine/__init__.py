"""Model backends behind one small abstract base class (``engine.base.Engine``), chosen by name; heavy imports stay
inside each backend."""

from __future__ import annotations

import importlib
from typing import Any

from engine.base import Engine, Generation, Message, Usage
from engine.distribution import install_hint
from engine.errors import EngineConfigError, EngineError

# name -> "module:factory"; imported only when that backend is asked for.
BACKENDS: dict[str, str] = {
    "scripted": "engine.scripted:ScriptedEngine.from_options",
    "transformers": "engine.transformers:TransformersEngine.from_options",
    "llamacpp": "engine.llamacpp:LlamaCppEngine.from_options",
    "vllm": "engine.vllm:VLLMEngine.from_options",
    "openai": "engine.openai:OpenAIEngine.from_options",
}
DEFAULT = "llamacpp"
# the install extra that brings each backend's dependencies (the core has the others')
EXTRAS = {"llamacpp": "embedded", "transformers": "embedded", "vllm": "vllm"}


def load(name: str, *, preset: str | None = None, **options: Any) -> Engine:
    """Build the backend called ``name`` with its options (unknown names list the valid ones).

    Options set to None are dropped, so callers can pass every command-line option through.
    ``preset`` (``engine.presets``) fills the options it names that are not given and that the
    backend takes (a backend's ``options``).
    """
    target = BACKENDS.get(name)
    if target is None:
        valid = ", ".join(sorted(BACKENDS))
        raise EngineConfigError(f"unknown engine {name!r}; valid engines: {valid}")
    module_name, _, attr_path = target.partition(":")
    try:
        return _build(module_name, attr_path, preset, options)
    except ModuleNotFoundError as exc:  # a backend's dependency that its install extra brings
        extra = EXTRAS.get(name, "all")
        raise EngineConfigError(f"the {name} engine needs {exc.name}: {install_hint(extra)}") from exc


def _build(module_name: str, attr_path: str, preset: str | None, options: dict[str, Any]) -> Engine:
    owner: Any = importlib.import_module(module_name)
    *class_path, factory = attr_path.split(".")
    for attr in class_path:
        owner = getattr(owner, attr)
    given = {k: v for k, v in options.items() if v is not None}
    if preset is not None:
        from engine.presets import preset as preset_options

        taken: frozenset[str] = getattr(owner, "options", frozenset())
        given = {**{k: v for k, v in preset_options(preset).items() if k in taken}, **given}
    engine: Engine = getattr(owner, factory)(**given)
    return engine


__all__ = ["BACKENDS", "DEFAULT", "Engine", "EngineConfigError", "EngineError", "Generation", "Message", "Usage",
           "load"]
