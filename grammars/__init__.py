"""Grammars for the four-block output protocol, derived from the protocol's pydantic models."""
