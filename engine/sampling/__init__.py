"""Choosing tokens: per-request sampling parameters, the batched sampler, and
structured-output grammars (llguidance) that mask the logits."""
