"""Tools: schemas from typed functions and pydantic models, loading from module:attribute, failures."""

from __future__ import annotations

from typing import Literal

import pytest
from pydantic import BaseModel

from flowstate import Tool, ToolSet, load_tools
from flowstate.errors import ToolLoadError


def book(hotel_id: str, nights: int = 1, kind: Literal["single", "double"] = "double") -> dict[str, object]:
    """Book a hotel room.

    More text that is not part of the description.
    """
    return {"hotel_id": hotel_id, "nights": nights, "kind": kind}


class Transfer(BaseModel):
    """Book an airport transfer."""

    date: str
    passengers: int = 1


def test_schema_from_a_typed_function() -> None:
    tool = Tool.from_function(book)
    assert tool.spec() == {
        "name": "book",
        "description": "Book a hotel room.",
        "parameters": {
            "additionalProperties": False,
            "properties": {
                "hotel_id": {"title": "Hotel Id", "type": "string"},
                "nights": {"default": 1, "title": "Nights", "type": "integer"},
                "kind": {"default": "double", "enum": ["single", "double"], "title": "Kind", "type": "string"},
            },
            "required": ["hotel_id"],
            "type": "object",
        },
    }
    assert tool.run({"hotel_id": "A", "nights": 2}) == ({"hotel_id": "A", "nights": 2, "kind": "double"}, None)
    result, error = tool.run({"hotel_id": "A", "kind": "suite"})
    assert result is None and error is not None and error.startswith("invalid arguments for book: kind:")
    assert tool.run({"hotel": "A"})[1] is not None  # unknown and missing fields are errors


def test_tool_from_a_pydantic_model() -> None:
    tool = Tool.from_model(Transfer, lambda t: {"booked": t.date, "n": t.passengers}, name="transfer")
    assert tool.description == "Book an airport transfer." and tool.parameters["required"] == ["date"]
    assert tool.run({"date": "2026-09-20"}) == ({"booked": "2026-09-20", "n": 1}, None)


def test_a_raising_tool_becomes_an_error() -> None:
    def broken() -> None:
        """Fails."""
        raise KeyError("gone")

    assert ToolSet([broken]).call("broken", {}) == (None, "KeyError: 'gone'")


def test_load_tools() -> None:
    tools = load_tools("flowstate.demo.hotel:TOOLS")
    assert list(tools) == ["search_hotels", "book_hotel", "cancel_booking", "book_transfer"]
    assert list(load_tools("tests.flowstate.test_tools:book")) == ["book"]


@pytest.mark.parametrize(("target", "message"), [
    ("no_colon", "module:attribute"),
    ("no_such_module_xyz:T", "cannot import"),
    ("flowstate.demo.hotel:NOPE", "has no attribute"),
    ("flowstate.demo.hotel:POLICY", "not a tool set"),
])
def test_load_tools_errors(target: str, message: str) -> None:
    with pytest.raises(ToolLoadError, match=message):
        load_tools(target)


def test_duplicate_tool_names_are_refused() -> None:
    with pytest.raises(ToolLoadError, match="two tools are named 'book'"):
        ToolSet([book, Tool.from_function(book)])
