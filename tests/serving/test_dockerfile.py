"""Dockerfile.gpu cannot be built here (no Docker engine); check what can be checked without one."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

from flowstate.cli import serve

ROOT = Path(__file__).resolve().parents[2]


def test_dockerfile_copies_what_exists_and_its_entrypoint_parses() -> None:
    text = (ROOT / "Dockerfile.gpu").read_text()
    assert re.search(r"^FROM vllm/vllm-openai:v\d+\.\d+\.\d+$", text, re.M)
    for line in re.findall(r"^COPY (.+)$", text, re.M):
        *sources, _ = line.split()
        assert all((ROOT / s).exists() for s in sources), line
    entry = json.loads(re.search(r"^ENTRYPOINT (.+)$", text, re.M).group(1))  # type: ignore[union-attr]
    assert entry[:2] == ["sh", "-c"]
    argv = shlex.split(entry[2].replace('"$FLOWSTATE_MODEL"', "/models/m").replace('"$@"', ""))
    assert argv[:3] == ["exec", "flowstate", "serve"]
    ctx = serve.make_context("serve", argv[3:])  # click refuses unknown options or bad values
    assert (ctx.params["name"], ctx.params["model"], ctx.params["host"]) == ("vllm", "/models/m", "0.0.0.0")
