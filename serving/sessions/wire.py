"""What the session and memory routes take and answer: typed query parameters and response models."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import Path as FastAPIPath
from pydantic import BaseModel, ConfigDict, Field

# -- what the routes take ------------------------------------------------------------------------------------------

class SessionsQuery(BaseModel):
    limit: int = Field(100, description="sessions a page, 1 to 1000")
    after: str | None = Field(None, description="the page after this session")
    name: str = Field("", description="only sessions whose name contains this (ignoring case)")


class SessionQuery(BaseModel):
    layout: bool = Field(False, description="also where each part of the state graph goes (the console draws it)")


class SearchQuery(BaseModel):
    """Memory search's parameters, as text: ``Search.parse`` checks them (a 400 ``invalid_search`` says what is
    wrong)."""

    q: str | None = Field(None, description="the words to search for")
    type: str | None = Field(None, description="state types, comma-separated")
    session: str | None = Field(None, description="only this session (and what a fork shares)")
    since: str | None = Field(None, description="ISO date or unix seconds, inclusive")
    until: str | None = Field(None, description="ISO date or unix seconds, inclusive")
    limit: str | None = Field(None, description="hits a page, 1 to 100 (default 20)")
    after: str | None = Field(None, description="the cursor of the page before (its next)")
    in_: str | None = Field(None, alias="in", description="states, observations, or both (comma-separated)")


# -- what they answer ----------------------------------------------------------------------------------------------

class ForkPoint(BaseModel):
    session: str
    requests: int


class SessionRow(BaseModel):
    id: str
    object: Literal["session"] = "session"
    requests: int
    states: int
    created_at: int | None
    last_activity: int | None
    strategy: str | None
    forked_from: ForkPoint | None
    running: bool


class SessionList(BaseModel):
    object: Literal["list"] = "list"
    data: list[SessionRow]
    first_id: str | None
    last_id: str | None
    has_more: bool


class MemoryHit(BaseModel):
    object: Literal["memory.hit"] = "memory.hit"
    session: str
    request: int
    state_id: str
    kind: str
    type: str
    summary: str
    score: float
    created: int | None


class HitPage(BaseModel):
    object: Literal["list"] = "list"
    data: list[MemoryHit]
    has_more: bool
    next: str | None


class GivenFeedback(BaseModel):
    key: str
    score: float | None
    label: str | None
    comment: str
    at: float


class FinishedRequest(BaseModel):
    index: int
    query: str
    response: str | None
    unfinished: str | None
    created_at: int | None
    strategy: str | None


class RequestSummary(FinishedRequest):
    feedback: list[GivenFeedback] = []


class IndexState(BaseModel):
    state_id: str
    summary: str


class IndexEntryOut(BaseModel):
    query_id: int
    user_query: str
    states: list[IndexState]


class RelationOut(BaseModel):
    rel: str
    target: str


class NodeOut(BaseModel):
    id: str
    kind: str
    type: str
    summary: str
    value: Any
    request: int
    relations: list[RelationOut]


class Pending(BaseModel):
    tool_call_ids: list[str]


class Running(BaseModel):
    """The request a turn runs now, or that waits on the client's tool results."""

    model_config = ConfigDict(extra="allow")
    index: int
    query: str
    waiting: bool
    steps: list[dict[str, Any]]


class Column(BaseModel):
    index: int
    x: float


class Spot(BaseModel):
    id: str
    x: float
    y: float


class Edge(BaseModel):
    source: str
    target: str
    rel: str
    path: str
    label_x: float
    label_y: float


class GraphLayout(BaseModel):
    """``serving.graph.layout``: the one layout the graph page and the console both draw."""

    width: float
    height: float
    node_width: float
    node_height: float
    columns: list[Column]
    nodes: list[Spot]
    edges: list[Edge]


class SessionViewOut(BaseModel):
    id: str
    object: Literal["session"] = "session"
    session: str
    forked_from: ForkPoint | None
    forks: list[ForkPoint]
    requests: list[RequestSummary]
    index: list[IndexEntryOut]
    nodes: list[NodeOut]
    pending: Pending | None
    running: Running | None
    layout: GraphLayout | None = None


class RequestView(FinishedRequest):
    object: Literal["session.request"] = "session.request"
    session: str
    record: dict[str, Any]


class Deleted(BaseModel):
    id: str
    object: Literal["session.deleted"] = "session.deleted"
    deleted: bool = True


class Imported(BaseModel):
    object: Literal["session.import"] = "session.import"
    sessions: list[str]


# -- the service ---------------------------------------------------------------------------------------------------


MAX_REQUEST = 2**31 - 1  # a request's index, as both databases' integer columns hold it
RequestIndex = Annotated[int, FastAPIPath(ge=1, le=MAX_REQUEST, description="the request's number, from 1")]
