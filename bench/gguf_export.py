"""Write a Hugging Face Llama checkpoint (the bench's random one) as a GGUF.

    python bench/gguf_export.py CHECKPOINT_DIR OUT.gguf          # float32
    python bench/gguf_export.py CHECKPOINT_DIR OUT.gguf f16      # matrices in float16, norms float32

Run with the ``gguf`` package of the llama.cpp tree being compared (bench/peer_llamacpp.sh
installs it into its own venv). Needed because convert_hf_to_gguf.py refuses BPE
tokenizers it does not know, and the bench checkpoint's byte-level tokenizer is one.
Tokens beyond the tokenizer's vocabulary are written as unused placeholders; q and k
projections are permuted to llama.cpp's rotary layout, as convert_hf_to_gguf.py does.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import gguf
import numpy as np
from safetensors.numpy import load_file


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF's rotate-half rows -> llama.cpp's interleaved pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def tokens_for(folder: Path, n_vocab: int) -> tuple[list[str], list[int], list[str], int | None]:
    tok = json.loads((folder / "tokenizer.json").read_text())
    vocab: dict[str, int] = dict(tok["model"]["vocab"])
    specials = {a["content"]: a["id"] for a in tok.get("added_tokens", [])}
    vocab.update(specials)
    by_id = {i: t for t, i in vocab.items()}
    tokens, types = [], []
    for i in range(n_vocab):
        if i in by_id:
            tokens.append(by_id[i])
            types.append(gguf.TokenType.CONTROL if by_id[i] in specials else gguf.TokenType.NORMAL)
        else:
            tokens.append(f"<unused{i}>")
            types.append(gguf.TokenType.UNUSED)
    merges = [" ".join(m) if isinstance(m, list) else m for m in tok["model"].get("merges", [])]
    if not merges:  # llama.cpp refuses a BPE without merges: give it one, in an unused slot
        slot = types.index(gguf.TokenType.UNUSED)
        merges, tokens[slot], types[slot] = ["Ġ Ġ"], "ĠĠ", gguf.TokenType.NORMAL
    eos = next(iter(specials.values()), None)
    return tokens, types, merges, eos


def main() -> None:
    folder, out = Path(sys.argv[1]), Path(sys.argv[2])
    f16 = len(sys.argv) > 3 and sys.argv[3] == "f16"
    cfg = json.loads((folder / "config.json").read_text())
    n_layer, n_head, n_kv = cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hidden = cfg["hidden_size"]
    head_dim = cfg.get("head_dim") or hidden // n_head
    rope_theta = cfg.get("rope_theta") or (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0)
    w = gguf.GGUFWriter(str(out), "llama")
    w.add_name("slotserve-bench")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(hidden)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(float(rope_theta))
    w.add_layer_norm_rms_eps(cfg.get("rms_norm_eps", 1e-6))
    w.add_vocab_size(cfg["vocab_size"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if f16 else gguf.LlamaFileType.ALL_F32)
    tokens, types, merges, eos = tokens_for(folder, cfg["vocab_size"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    if eos is not None:
        w.add_eos_token_id(eos)
    w.add_add_bos_token(False)

    tensors = load_file(str(folder / "model.safetensors"))
    matrix = (lambda a: a.astype(np.float16) if a.ndim == 2 else a) if f16 else (lambda a: a)  # noqa: E731
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    per_layer = {
        "input_layernorm": "attn_norm",
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "post_attention_layernorm": "ffn_norm",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }
    for name, data in tensors.items():
        data = data.astype(np.float32)
        if name in names:
            target = names[name]
        elif name == "lm_head.weight":
            target = "output.weight"
        else:
            parts = name.split(".")  # model.layers.{i}.<module...>.weight
            i, module = parts[2], ".".join(parts[3:-1])
            target = f"blk.{i}.{per_layer[module]}.weight"
            if module == "self_attn.q_proj":
                data = permute(data, n_head)
            elif module == "self_attn.k_proj":
                data = permute(data, n_kv)
        w.add_tensor(target, np.ascontiguousarray(matrix(data)))
    if "lm_head.weight" not in tensors:
        w.add_tensor("output.weight", matrix(tensors["model.embed_tokens.weight"].astype(np.float32)))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {out} ({out.stat().st_size / 1e6:.0f} MB)")


if __name__ == "__main__":
    main()
