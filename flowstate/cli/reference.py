"""``docs/cli.md``, written from the commands themselves: every command, its help and every option with
its default, so the page cannot drift from the code (``tests/test_docs.py`` compares them).

``python -m flowstate.cli.reference > docs/cli.md`` rewrites it.
"""

from __future__ import annotations

import click

HEADER = """# Command reference

Written from the commands themselves by `python -m flowstate.cli.reference > docs/cli.md` (`tests/test_docs.py`
fails when it is stale). [cli-guide.md](cli-guide.md) shows how the commands fit together; this page lists them.
"""


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\\\|")


def _default(param: click.Parameter) -> str:
    value = param.default
    if value is None or callable(value) or isinstance(value, list | tuple) or type(value).__name__ == "Sentinel":
        return ""  # none, computed at run time, or a repeatable option's empty list
    if isinstance(param, click.Option) and param.is_flag and not value:
        return ""
    return f"`{value}`"


def _command(path: str, command: click.Command) -> list[str]:
    out = [f"## `{path}`", "", _cell(command.help or "").strip() or "(no help)", ""]
    options = [p for p in command.params if isinstance(p, click.Option) and not p.hidden]
    arguments = [p for p in command.params if isinstance(p, click.Argument)]
    if arguments:
        out += ["Arguments: " + ", ".join(f"`{a.human_readable_name}`" for a in arguments), ""]
    from flowstate.cli.options import Sectioned

    groups = command.sectioned(options) if isinstance(command, Sectioned) else [("", options)]
    for title, group in groups:
        if not group:
            continue
        out += [f"**{title}**", ""] if title else []
        out += ["| option | default | what |", "|---|---|---|"]
        for option in group:
            names = ", ".join(f"`{n}`" for n in option.opts + option.secondary_opts)
            out.append(f"| {names} | {_default(option)} | {_cell(option.help or '')} |")
        out.append("")
    return out


def render(group: click.Group, prefix: str = "flowstate") -> str:
    lines = [HEADER]
    ctx = click.Context(group)

    def walk(cmd: click.Command, path: str) -> None:
        if isinstance(cmd, click.Group):
            for name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, name)
                if sub is not None:
                    walk(sub, f"{path} {name}")
        else:
            lines.extend(_command(path, cmd))

    walk(group, prefix)
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    from flowstate.cli import main

    click.echo(render(main), nl=False)
