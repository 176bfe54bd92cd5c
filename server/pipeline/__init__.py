"""A request from its body to the engine and back: the engine request, the run and its
admission, chat prompts and answers (reasoning, tool calls), structured outputs, SSE."""
