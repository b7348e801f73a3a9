"""Which grammar each model call is decoded under: none, the static protocol grammar, or the
per-step id-aware grammar built from the Active State (what the rules of B.4 admit right now)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import Enum
from typing import Any

from flowstate.active import ActiveState
from flowstate.limits import STANDARD, Limits
from flowstate.protocol import BLOCKS, block_schemas
from flowstate.request_options import RequestOptions
from grammars.four_blocks import StepIds, ToolBounds, protocol_grammar


class GrammarMode(str, Enum):
    NONE = "none"
    STATIC = "static"
    STEP = "step"


def step_ids(state: ActiveState) -> StepIds:
    """The ids state_focus, update/remove and refs may name at this step."""
    visible = state.visible_ids()
    tool_refs = state.tool_refs()
    return StepIds(
        focus=tuple(sorted((state.index_ids | tool_refs) - visible)),
        own=tuple(n.id for n in state.current),
        refs=tuple(sorted(state.ref_targets())),
    )


class Grammars:
    """Builds grammar texts for one agent configuration (tools and limits fixed); the static one once."""

    def __init__(
        self, tools: Sequence[Mapping[str, Any]], mode: GrammarMode = GrammarMode.STEP, blocks: Sequence[str] = BLOCKS,
        limits: Limits = STANDARD, options: RequestOptions | None = None,
    ) -> None:
        self.mode = mode
        self.blocks = tuple(blocks)
        self.limits = limits
        self.options = options or RequestOptions()
        self._tools = self.options.tools([dict(t) for t in tools])
        self._schemas = block_schemas(limits)
        self._bounds = ToolBounds(limits.tool_text, limits.tool_items)
        self.static = self._build(None) if mode is GrammarMode.STATIC else None
        self._static_final: str | None = None

    def validate(self) -> None:
        """Raise ``grammars.check.GrammarError`` unless llguidance compiles this configuration's grammar."""
        from grammars.check import validate

        validate(self.static or self._build(None))

    def _build(self, ids: StepIds | None, final: bool = False) -> str:
        o = self.options
        return protocol_grammar(self._schemas, self._tools, ids, self.blocks, self._bounds, require_tools=o.required,
                                max_calls=None if o.parallel_tool_calls else 1, answer_schema=o.answer_schema,
                                final=final)

    def for_step(self, state: ActiveState, final: bool = False) -> str | None:
        """The grammar of the next step; ``final``: the request's last allowed step, which must decide (answer,
        or where tools are required call them)."""
        if self.mode is GrammarMode.NONE:
            return None
        if self.mode is GrammarMode.STATIC:
            if not final:
                return self.static
            if self._static_final is None:
                self._static_final = self._build(None, final=True)
            return self._static_final
        return self._build(step_ids(state), final)
