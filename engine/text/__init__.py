"""Text: the tokenizer, the incremental detokenizer with stop strings, and chat
templates (the model's own or built-in ones by name)."""
