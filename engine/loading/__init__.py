"""Loading a checkpoint: Hugging Face folders and GGUF files become a model config, a
tokenizer and a model with its weights, plus the fingerprint slot files are checked
against."""
