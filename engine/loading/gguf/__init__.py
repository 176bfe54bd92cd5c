"""GGUF files: the file reader (metadata, tensors read one at a time), what each
architecture is as a Hugging Face checkpoint, and the tokenizer rebuilt from metadata."""
