"""OpenAI's Responses API (POST /v1/responses) over the chat machinery."""
