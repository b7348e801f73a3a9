"""Tools: a typed Python function (or a pydantic argument model) becomes a tool with a JSON schema; a tool
described by a JSON schema (an MCP server's, a recording's) is a ``SchemaTool``.

Running a tool never raises: a tool that raises, an unknown tool or bad arguments all become an
error observation that the model sees. A call names the session it runs for: a tool source scoped per
session (``flowstate.mcp``) keeps one server per session; Python tools ignore it.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, get_type_hints

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from flowstate.errors import ToolLoadError


class ToolError(Exception):
    """Raised by a tool to report a failure in its own words: the model sees the message as it is (any other
    exception is shown as ``Type: message``)."""


@dataclass(frozen=True)
class Tool:
    """A callable the agent may use, with the JSON schema of its arguments."""

    name: str
    description: str
    args_model: type[BaseModel]
    fn: Callable[..., Any]
    unpack: bool = True  # call fn(**args) (functions) or fn(model_instance)
    read_only: bool = False  # changes nothing (MCP readOnlyHint): called again with only reads between, it repeats

    @property
    def parameters(self) -> dict[str, Any]:
        schema = self.args_model.model_json_schema()
        schema.pop("title", None)
        return schema

    def spec(self) -> dict[str, Any]:
        """The tool as shown to the model and as OpenAI's ``function`` shape."""
        return {"name": self.name, "description": self.description, "parameters": self.parameters}

    @classmethod
    def from_function(cls, fn: Callable[..., Any], name: str | None = None, description: str | None = None) -> Tool:
        """A tool from a function with type-hinted parameters; its docstring is the description."""
        hints = get_type_hints(fn)
        fields: dict[str, Any] = {}
        for pname, param in inspect.signature(fn).parameters.items():
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                raise ToolLoadError(f"tool {fn.__name__}: *args/**kwargs cannot be described as a schema")
            annotation = hints.get(pname, Any)
            default = ... if param.default is param.empty else param.default
            fields[pname] = (annotation, default)
        model = create_model(
            f"{fn.__name__}_args", __config__=ConfigDict(extra="forbid"), **fields
        )
        doc = inspect.getdoc(fn) or ""
        return cls(name or fn.__name__, description or doc.split("\n\n")[0].strip(), model, fn)

    @classmethod
    def from_model(cls, args_model: type[BaseModel], fn: Callable[[Any], Any], name: str | None = None) -> Tool:
        """A tool whose arguments are a pydantic model; ``fn`` receives the validated instance."""
        doc = inspect.getdoc(args_model) or inspect.getdoc(fn) or ""
        return cls(name or fn.__name__, doc.split("\n\n")[0].strip(), args_model, fn, unpack=False)

    def run(self, arguments: Mapping[str, Any], session: str = "") -> tuple[Any, str | None]:
        """Call the tool: (result, None) on success, (None, error message) on any failure."""
        try:
            args = self.args_model.model_validate(dict(arguments))
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}" for e in exc.errors())
            return None, f"invalid arguments for {self.name}: {problems}"
        if self.unpack:
            return _outcome(lambda: self.fn(**{k: getattr(args, k) for k in type(args).model_fields}))
        return _outcome(lambda: self.fn(args))


def _outcome(call: Callable[[], Any]) -> tuple[Any, str | None]:
    """A tool's (result, None), or (None, why) where it raised: a tool's failure is an observation, not a crash."""
    try:
        result = call()
    except ToolError as exc:
        return None, str(exc)
    except Exception as exc:
        return None, f"{type(exc).__name__}: {exc}"
    if isinstance(result, BaseModel):
        result = result.model_dump(mode="json")
    return result, None


class _Given(BaseModel):
    """A schema tool's arguments, as given (its JSON schema checks them)."""

    model_config = ConfigDict(extra="allow")


@dataclass(frozen=True, kw_only=True)
class SchemaTool(Tool):
    """A tool described by a JSON schema rather than Python types (an MCP server's tools, a recording's):
    ``fn(arguments, session)`` gets the arguments as a dict, checked first against ``schema`` with its objects
    closed to their declared properties, as the grammar decodes them (``check=False``: taken as they are)."""

    args_model: type[BaseModel] = _Given
    schema: dict[str, Any] = field(default_factory=lambda: {"type": "object"})
    check: bool = True

    @property
    def parameters(self) -> dict[str, Any]:
        return self.schema

    @functools.cached_property
    def _validator(self) -> Any:
        """The closed schema's validator, built once per tool (not per call)."""
        from jsonschema.validators import validator_for

        from grammars.four_blocks import strict_arguments

        schema = strict_arguments(self.schema)
        return validator_for(schema)(schema)

    def run(self, arguments: Mapping[str, Any], session: str = "") -> tuple[Any, str | None]:
        given = dict(arguments)
        if self.check:
            error = next(iter(self._validator.iter_errors(given)), None)
            if error is not None:
                where = ".".join(str(p) for p in error.absolute_path) or "arguments"
                return None, f"invalid arguments for {self.name}: {where}: {error.message}"
        return _outcome(lambda: self.fn(given, session))


class ToolSource(Protocol):
    """What holds a tool set's remote tools open (an MCP server): its name and tools' specs, per-session resources
    (``live`` connections, ``released`` to keep within a bound, never one of a session ``busy`` says a turn holds),
    and the whole."""

    specs: list[dict[str, Any]]
    busy: Callable[[str], bool]
    released: int

    @property
    def live(self) -> int: ...

    @property
    def name(self) -> str: ...

    def release(self, session: str) -> None: ...

    def close(self) -> None: ...


class ToolSet(Mapping[str, Tool]):
    """Tools by name, in the order given; ``sources``: what holds remote tools among them open (``release`` a
    session's share when the session leaves memory, ``close`` the whole when done)."""

    def __init__(self, tools: Iterable[Tool | Callable[..., Any]] = (), sources: Sequence[ToolSource] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        self.sources = tuple(sources)
        # a call's arguments as its tool gets them, given its session (a server that redacts restores placeholders)
        self.restore: Callable[[str, Mapping[str, Any]], Mapping[str, Any]] | None = None
        for t in tools:
            tool = t if isinstance(t, Tool) else Tool.from_function(t)
            if tool.name in self._tools:
                raise ToolLoadError(f"two tools are named {tool.name!r}")
            self._tools[tool.name] = tool

    def __getitem__(self, name: str) -> Tool:
        return self._tools[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._tools)

    def __len__(self) -> int:
        return len(self._tools)

    def specs(self) -> list[dict[str, Any]]:
        return [t.spec() for t in self._tools.values()]

    def read_only(self, name: str) -> bool:
        """Whether the tool ``name`` is declared to change nothing (an unknown tool is not)."""
        tool = self._tools.get(name)
        return tool is not None and tool.read_only

    def call(self, name: str, arguments: Mapping[str, Any], session: str = "") -> tuple[Any, str | None]:
        tool = self._tools.get(name)
        if tool is None:
            return None, f"unknown tool {name!r}; available: {', '.join(self._tools) or 'none'}"
        if self.restore is not None:  # placeholders the model wrote for redacted values: the values, just for the tool
            arguments = self.restore(session, arguments)
        return tool.run(arguments, session)

    def release(self, session: str) -> None:
        """What the tools hold for ``session`` (a session-scoped MCP server) is let go."""
        for source in self.sources:
            source.release(session)

    def hold_while(self, busy: Callable[[str], bool]) -> None:
        """Sessions ``busy`` names (a running turn holds them) keep what the sources hold for them."""
        for source in self.sources:
            source.busy = busy

    def close(self) -> None:
        for source in self.sources:
            source.close()

    def __enter__(self) -> ToolSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def load_tools(target: str) -> ToolSet:
    """Load a tool set from ``module:attribute``: a ToolSet, a Tool, a function, or a list of them."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise ToolLoadError(f"tools must be named as module:attribute, got {target!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ToolLoadError(f"cannot import tool module {module_name!r}: {exc}") from exc
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ToolLoadError(f"module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if isinstance(obj, ToolSet):
        return obj
    if isinstance(obj, Tool) or callable(obj):
        return ToolSet([obj])
    if isinstance(obj, list | tuple):
        if not all(isinstance(t, Tool) or callable(t) for t in obj):
            raise ToolLoadError(f"{target} holds something that is neither a Tool nor a function")
        return ToolSet(obj)
    raise ToolLoadError(f"{target} is not a tool set (expected a ToolSet, Tool, function or list of them)")
