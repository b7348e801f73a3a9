"""The written protocol of prompts: the tags of their sections and the markers of memory calls, shared by the
serializer and the memory methods that write prompts and the reference policies that read them back."""

from __future__ import annotations

import re

# sections of a step's user message, in the order the serializer lays them out
USER_QUERY = "user_query"
STATE_RECORD = "state_record"  # flowstate-lean: this request records what later requests need of the chat
ACTIVE_STATE = "active_state"
TRAJECTORY = "trajectory"
FEEDBACK = "feedback"
LATEST_OBSERVATION = "latest_observation"
# the memory section, one per method
HISTORICAL_INDEX = "historical_state_index"  # flowstate, no-isu
INTERACTION_HISTORY = "interaction_history"  # (the transcript memory calls and bm25's chunks are cut from)
TOOL_RESULTS = "tool_results"  # full-context: one step's tool results, a user message of the chat
RETRIEVED_MEMORY = "retrieved_memory"  # bm25
MEMORIES = "memories"  # mem0-style
STRATEGY_MEMORY = "strategy_memory"  # reasoningbank
TRACKED_STATE = "tracked_state"  # zipact
EXECUTION_STATE = "execution_state"  # mage
# sections of memory calls' user messages
INTERACTION = "interaction"  # a finished request (mem0-style extraction)
SEGMENT = "segment"  # a finished segment (MAGE's Compress and Maintain)
SUMMARY = "summary"  # the summary Maintain checks
NEW_OBSERVATION = "new_observation"  # the newest tool results (the ZipAct tracker)
RESPONSE = "response"  # the request's final response (the ZipAct tracker at the end)

# a memory call's system message starts with its marker, for a reader of the prompt; code (engines, reference
# policies) dispatches on the call's declared ``engine.base.Purpose``, never on these
EXTRACT = "<extract_memories>"
TRACK = "<track_state>"
COMPRESS = "<compress_segment>"
MAINTAIN = "<maintain_summary>"
UPDATE = "<update_memories>"
JUDGE = "<judge_trajectory>"
DISTILL = "<distill_strategies>"


def block(tag: str, body: str) -> str:
    """A section: ``body`` (ending in a newline) between the tag's lines."""
    return f"<{tag}>\n{body}</{tag}>\n"


def read(text: str, tag: str) -> str | None:
    """The body of the first ``tag`` section of ``text`` without its final newline, or None."""
    found = re.search(rf"<{tag}>\n(.*?)</{tag}>", text, re.S)
    if found is None:
        return None
    body = found.group(1)
    return body[:-1] if body.endswith("\n") else body
