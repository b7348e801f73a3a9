"""OpenAI-compatible agent endpoint (FastAPI) over FlowState sessions."""
