"""Named sampling presets: engine options that a paper or a deployment fixes, applied where a backend takes them."""

from __future__ import annotations

from typing import Any

PRESETS: dict[str, dict[str, Any]] = {
    # FlowState paper, Appendix B.5: vLLM request parameters of every agent call. The completion budget
    # is capped by each engine at what the model's context leaves after the prompt.
    "paper": {"temperature": 0.1, "top_p": 1.0, "max_tokens": 32_768,
              "chat_template_kwargs": {"enable_thinking": False}},
}


def preset(name: str) -> dict[str, Any]:
    """The options of preset ``name`` (a copy)."""
    try:
        return {k: (dict(v) if isinstance(v, dict) else v) for k, v in PRESETS[name].items()}
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; valid presets: {', '.join(PRESETS)}") from None
