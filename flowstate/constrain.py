"""Which grammar each model call is decoded under: none, the static protocol grammar, or the
per-step id-aware grammar built from the Active State (what the rules of B.4 admit right now)."""

from __future__ import annotations

import string
from collections.abc import Mapping, Sequence
from enum import Enum
from typing import Any

from flowstate.active import ActiveState
from flowstate.limits import STANDARD, Limits
from flowstate.nodes import OBSERVATION_PREFIX, PAGE_PREFIX
from flowstate.protocol import BLOCKS, block_schemas
from flowstate.request_options import RequestOptions
from grammars.four_blocks import StepIds, ToolBounds, protocol_grammar
from grammars.ids import IdShape, unused_id_pattern


class GrammarMode(str, Enum):
    NONE = "none"
    STATIC = "static"
    STEP = "step"


ID_SHAPE = IdShape(string.ascii_lowercase, string.ascii_lowercase + string.digits + "_", 48)
"""``nodes.ID_PATTERN`` as a shape (a test checks that the two agree)."""


def step_ids(state: ActiveState) -> StepIds:
    """The ids state_focus, update/remove and refs may name at this step, and those an add may still take."""
    visible = state.visible_ids()
    tool_refs = state.tool_refs()
    used = sorted(state.history_ids | {n.id for n in state.current})
    return StepIds(
        focus=tuple(sorted((state.index_ids | tool_refs) - visible)),
        own=tuple(n.id for n in state.current),
        refs=tuple(sorted(state.ref_targets())),
        new=unused_id_pattern(ID_SHAPE, used, (OBSERVATION_PREFIX, PAGE_PREFIX)),
    )


class Grammars:
    """Builds grammar texts for one agent configuration (tools and limits fixed); the static one once."""

    def __init__(
        self, tools: Sequence[Mapping[str, Any]], mode: GrammarMode = GrammarMode.STEP, blocks: Sequence[str] = BLOCKS,
        limits: Limits = STANDARD, options: RequestOptions | None = None, optional: Sequence[str] = (),
    ) -> None:
        self.mode = mode
        self.blocks = tuple(blocks)
        self.optional = tuple(optional)  # blocks written only when they hold something
        self.limits = limits
        self.options = options or RequestOptions()
        self._tools = self.options.tools([dict(t) for t in tools])
        self._schemas = block_schemas(limits)
        self._bounds = ToolBounds(limits.tool_text, limits.tool_items)
        self.static = self._build(None) if mode is GrammarMode.STATIC else None
        self._static: dict[tuple[bool, bool, tuple[str, ...]], str] = {}  # a final, holding or narrower step's
        self.validated = False

    def validate(self) -> None:
        """Raise ``grammars.check.GrammarError`` unless llguidance compiles this configuration's grammar (compiled
        once: a configuration that compiled stays valid)."""
        from grammars.check import validate

        if not self.validated:
            validate(self.static or self._build(None))
            self.validated = True

    def _build(self, ids: StepIds | None, final: bool = False, hold: bool = False,
               blocks: tuple[str, ...] | None = None) -> str:
        o = self.options
        blocks = self.blocks if blocks is None else blocks
        return protocol_grammar(self._schemas, self._tools, ids, blocks, self._bounds, require_tools=o.required,
                                max_calls=None if o.parallel_tool_calls else 1, answer_schema=o.answer_schema,
                                final=final, hold=hold, optional=self.optional)

    def for_step(self, state: ActiveState, final: bool = False, hold: bool = False,
                 blocks: tuple[str, ...] | None = None) -> str | None:
        """The grammar of the next step; ``final``: the request's last allowed step, which must decide (answer,
        or where tools are required call them); ``hold``: the step after one whose calls were all refused as
        repeats, which calls nothing (it answers, or records and asks for state) unless tools are required;
        ``blocks``: the request's own, where it admits fewer than the configuration's (``Strategy.step_blocks``)."""
        if self.mode is GrammarMode.NONE:
            return None
        if self.mode is GrammarMode.STATIC:
            blocks = self.blocks if blocks is None else blocks
            if not final and not hold and blocks == self.blocks:
                return self.static
            if (final, hold, blocks) not in self._static:
                self._static[(final, hold, blocks)] = self._build(None, final, hold, blocks)
            return self._static[(final, hold, blocks)]
        return self._build(step_ids(state), final, hold, blocks)
