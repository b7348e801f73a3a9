"""The OpenAI-compatible agent endpoint: FastAPI app, sessions, tool round trips, streaming, keys."""
