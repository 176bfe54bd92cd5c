"""The Hugging Face names of a GGUF encoder file's tensors (issue 54), by architecture:
``blk.N.<x>`` to the layer's module path in the checkpoints engine/models/ reads
(bert.py, nomic_bert.py, modernbert.py, embedding_gemma.py), and a cross-encoder's head
(``cls``, ``cls.norm``, ``cls.output``). engine/loading/gguf/encoder_file.py reads the
file by them."""

from __future__ import annotations

NAMES = {  # GGUF tensor -> the Hugging Face name (blk.N.<x> -> encoder.layer.N.<y>)
    "token_embd": "embeddings.word_embeddings",
    "position_embd": "embeddings.position_embeddings",
    "token_types": "embeddings.token_type_embeddings",
    "token_embd_norm": "embeddings.LayerNorm",
    "attn_q": "attention.self.query",
    "attn_k": "attention.self.key",
    "attn_v": "attention.self.value",
    "attn_output": "attention.output.dense",
    "attn_output_norm": "attention.output.LayerNorm",
    "ffn_up": "intermediate.dense",
    "ffn_down": "output.dense",
    "layer_output_norm": "output.LayerNorm",
}
NOMIC_NAMES = {  # nomic-bert's published names (blk.N.<x> -> encoder.layers.N.<y>)
    "token_embd": "embeddings.word_embeddings",
    "token_types": "embeddings.token_type_embeddings",
    "token_embd_norm": "emb_ln",
    "attn_qkv": "attn.Wqkv",
    "attn_output": "attn.out_proj",
    "attn_output_norm": "norm1",
    "ffn_up": "mlp.fc11",
    "ffn_gate": "mlp.fc12",
    "ffn_down": "mlp.fc2",
    "layer_output_norm": "norm2",
}
MODERN_NAMES = {  # ModernBERT's (blk.N.<x> -> layers.N.<y>)
    "token_embd": "embeddings.tok_embeddings",
    "token_embd_norm": "embeddings.norm",
    "output_norm": "final_norm",
    "attn_norm": "attn_norm",
    "attn_qkv": "attn.Wqkv",
    "attn_output": "attn.Wo",
    "ffn_norm": "mlp_norm",
    "ffn_up": "mlp.Wi",
    "ffn_down": "mlp.Wo",
}
GEMMA_NAMES = {  # EmbeddingGemma's (blk.N.<x> -> layers.N.<y>); its norms stored as 1 + w
    "token_embd": "embed_tokens",
    "output_norm": "norm",
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "post_ffw_norm": "post_feedforward_layernorm",
}
ARCHS = {  # architecture -> (its tensor names, the layers' path)
    "bert": (NAMES, "encoder.layer"),
    "nomic-bert": (NOMIC_NAMES, "encoder.layers"),
    "modern-bert": (MODERN_NAMES, "layers"),
    "gemma-embedding": (GEMMA_NAMES, "layers"),
}
HEAD = {"cls": "classifier.dense", "cls.output": "classifier.out_proj"}  # a classifier's head
MODERN_HEAD = {"cls": "head.dense", "cls.norm": "head.norm", "cls.output": "classifier"}


def hf_name(name: str, arch: str = "bert") -> str | None:
    """``blk.3.attn_q.weight`` -> ``encoder.layer.3.attention.self.query.weight``,
    ``cls.output.weight`` -> ``classifier.out_proj.weight``; None for a tensor the
    encoder does not read."""
    names, layers = ARCHS[arch]
    head = MODERN_HEAD if arch == "modern-bert" else HEAD
    stem, _, leaf = name.rpartition(".")
    if stem in head:
        return f"{head[stem]}.{leaf}"
    parts = name.split(".")
    if parts[0] == "blk" and len(parts) == 4 and parts[2] in names:
        return f"{layers}.{parts[1]}.{names[parts[2]]}.{parts[3]}"
    if len(parts) == 2 and parts[0] in names:
        return f"{names[parts[0]]}.{parts[1]}"
    return None
