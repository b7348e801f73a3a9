"""A command's options from a TOML file (``--config FILE``) and what is in force (``--print-config``).

Every option of the command is a key of the file, named as its flag without the dashes (``port = 8080``,
``max-live-sessions = 2048``, ``api-key = ["…", "…"]``, ``redact = "mask"``); a key that names no option is refused
by name, with the nearest option. A flag given on the command line beats the file (said once, on stderr, at start);
the file stands where a flag would, so a ``[default: $VARIABLE]`` an option falls back on applies only when neither
gives a value (``--engine-api-key``, which click reads from ``$FLOWSTATE_ENGINE_API_KEY`` itself, is the one
variable that beats the file). ``--print-config`` prints the options in force as TOML, each with where it came from,
secrets masked, and exits."""

from __future__ import annotations

import difflib
import json
import os
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

# options a command reads from the environment itself, after click, when neither a flag nor the file gives them
# (comma-separated where the option repeats)
ENVIRONMENT = {"db": "FLOWSTATE_DB", "api_keys": "FLOWSTATE_API_KEYS", "admin_keys": "FLOWSTATE_ADMIN_KEYS",
               "metrics_keys": "FLOWSTATE_METRICS_KEYS", "retention": "FLOWSTATE_RETENTION",
               "vault_key": "FLOWSTATE_VAULT_KEY"}
SECRETS = ("key", "secret", "password", "token")  # an option whose flag holds one of these is shown masked
_OWN = ("config_file", "print_config")


def _flag(param: click.Parameter) -> str | None:
    longs = [o for o in getattr(param, "opts", ()) if o.startswith("--")]
    return max(longs, key=len)[2:] if longs else None


def _options(command: click.Command) -> dict[str, click.Parameter]:
    """The command's options by their file key (the longest flag without its dashes)."""
    return {flag: p for p in command.params if p.name not in _OWN and (flag := _flag(p)) is not None}


def _load(ctx: click.Context, _: click.Parameter, path: str | None) -> str | None:
    """Read FILE into the command's defaults (an eager option: before any other is resolved)."""
    if path is None:
        return None
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise click.BadParameter(f"cannot read {path}: {exc.strerror}", ctx, param_hint="--config") from None
    except tomllib.TOMLDecodeError as exc:
        raise click.BadParameter(f"{path} is not TOML: {exc}", ctx, param_hint="--config") from None
    known = _options(ctx.command)
    unknown = [k for k in data if k not in known]
    if unknown:
        near = difflib.get_close_matches(unknown[0], known, n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise click.BadParameter(f"{path}: {', '.join(map(repr, unknown))} is no option of flowstate "
                                 f"{ctx.info_name}{hint}; the keys are its flags without dashes", ctx,
                                 param_hint="--config")
    defaults = {}
    for key, value in data.items():
        param = known[key]
        if isinstance(value, dict):  # a JSON-object option (chat-template-kwargs) may be written as a TOML table
            value = json.dumps(value)
        defaults[param.name] = value
    ctx.default_map = {**(ctx.default_map or {}), **defaults}
    ctx.meta["flowstate.config"] = (path, set(defaults))
    return path


def config_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``--config FILE`` and ``--print-config`` on a command (its function takes ``config_file`` and
    ``print_config``)."""
    fn = click.option("--print-config", is_flag=True,
                      help="Print the options in force (as TOML, each with where it came from; secrets masked) "
                           "and exit.")(fn)
    return click.option("--config", "config_file", type=click.Path(dir_okay=False), default=None, is_eager=True,
                        callback=_load,
                        expose_value=True, help="Options from a TOML file: every option a key, named as its flag "
                        "without the dashes (docs/serve.toml); a flag on the command line beats the file.")(fn)


def announce(ctx: click.Context) -> None:
    """Say once which of the file's options the command line overrode."""
    path, keys = ctx.meta.get("flowstate.config", (None, set()))
    beaten = sorted(f"--{_flag(p)}" for p in ctx.command.params if p.name in keys
                    and ctx.get_parameter_source(p.name) is ParameterSource.COMMANDLINE)
    if beaten:
        click.echo(f"{', '.join(beaten)} on the command line beat{'s' if len(beaten) == 1 else ''} {path}", err=True)


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return _toml(json.dumps(value))
    return json.dumps(str(value), ensure_ascii=False)  # a TOML basic string is a JSON string


def in_force(ctx: click.Context) -> str:
    """The command's options as TOML: each value in force and where it came from (default, file, flag, environment);
    an option without a value commented out; secrets masked."""
    path, _ = ctx.meta.get("flowstate.config", (None, set()))
    sources = {ParameterSource.COMMANDLINE: "flag", ParameterSource.ENVIRONMENT: "environment",
               ParameterSource.DEFAULT_MAP: f"file {path}", ParameterSource.DEFAULT: "default"}
    lines = [f"# flowstate {ctx.info_name}: the options in force"]
    for key, param in _options(ctx.command).items():
        assert param.name is not None
        value = ctx.params.get(param.name)
        source = sources.get(ctx.get_parameter_source(param.name), "default")  # type: ignore[arg-type]
        variable = ENVIRONMENT.get(param.name, "")
        if (value is None or value == ()) and os.environ.get(variable):
            raw = os.environ[variable]
            value = [v.strip() for v in raw.split(",") if v.strip()] if getattr(param, "multiple", False) else raw
            source = f"environment ${variable}"
        if value is not None and value != () and any(s in key for s in SECRETS):
            value = ["***"] * len(value) if isinstance(value, (list, tuple)) else "***"
        if value is None or value == ():
            lines.append(f"# {key} =  ({source}: none)")
        else:
            lines.append(f"{key} = {_toml(value)}  # {source}")
    return "\n".join(lines)
