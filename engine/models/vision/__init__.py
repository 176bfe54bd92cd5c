"""Vision encoders and their projectors into a language model's embedding space."""
