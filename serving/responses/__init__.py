"""The OpenAI Responses API on FlowState's memory: ``POST /v1/responses`` runs on the same driver as chat completions
(a request's input items become the chat service's messages), responses are stored in the repository, and
``previous_response_id`` / ``conversation`` name the session a response continues."""
