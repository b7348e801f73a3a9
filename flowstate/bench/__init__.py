"""Benchmarks that print figures: decoding under grammars (``decode``) and the repository at scale (``repo``)."""
