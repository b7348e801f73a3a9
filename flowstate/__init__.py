"""FlowState: execution state as memory for long-horizon LLM agents.

``import flowstate`` imports neither torch nor vllm; engines load their backends on demand.
"""

from flowstate.agent import Agent
from flowstate.config import LoopConfig
from flowstate.errors import FlowStateError, ProtocolError, RequestFailed, SessionNotFound, StorageError
from flowstate.nodes import Node, Ref, Relation, StateType
from flowstate.protocol import ModelOutput
from flowstate.records import RunRecord
from flowstate.store.repository import Repository
from flowstate.tools import Tool, ToolSet, load_tools

__all__ = [
    "Agent", "FlowStateError", "LoopConfig", "ModelOutput", "Node", "ProtocolError", "Ref", "Relation",
    "Repository", "RequestFailed", "RunRecord", "SessionNotFound", "StateType", "StorageError", "Tool",
    "ToolSet", "load_tools",
]
