"""Anthropic's Messages API (`POST /v1/messages`, `/v1/messages/count_tokens`) over the same
engine loop as the OpenAI routes: request models, the prompt and sampling they become,
response and stream shapes, and errors in Anthropic's shape."""
