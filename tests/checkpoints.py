"""Tiny random Hugging Face checkpoints built with transformers (the oracle)."""

from __future__ import annotations

import json
from pathlib import Path

import torch


def jitter(model: torch.nn.Module, noise: float = 0.1, buffers: tuple[str, ...] = ()) -> None:
    """Every parameter moved off its init by ``noise`` x N(0, 1), so every one matters
    (norms and biases too); likewise the buffers whose names end with one of ``buffers``."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * noise)
        for name, b in model.named_buffers():
            if name.endswith(buffers):
                b.add_(torch.randn_like(b) * noise)


BASE = dict(
    vocab_size=320,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=512,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)


GEMMA3N_TINY = dict(  # alternating local / global layers; the last 2 reuse the caches of layers 0 and 1
    num_hidden_layers=4,
    layer_types=["sliding_attention", "full_attention"] * 2,
    num_kv_shared_layers=2,
    sliding_window=8,
    vocab_size_per_layer_input=320,
    hidden_size_per_layer_input=16,
    laurel_rank=8,
)


MAMBA2_TINY = dict(  # expand 2 x hidden 64 = 8 heads x 16; two groups share B/C; chunks of 8 (several per prompt)
    num_heads=8,
    head_dim=16,
    state_size=16,
    n_groups=2,
    conv_kernel=4,
    chunk_size=8,
    expand=2,
)


GRANITE_HYBRID_TINY = dict(  # Mamba2, Mamba2, attention (no rope), Mamba2; MoE of 4 experts, top 2, shared MLP
    num_hidden_layers=4,
    layer_types=["mamba", "mamba", "attention", "mamba"],
    mamba_n_heads=8,
    mamba_d_head=16,
    mamba_d_state=16,
    mamba_n_groups=2,
    mamba_chunk_size=8,
    num_local_experts=4,
    num_experts_per_tok=2,
    shared_intermediate_size=64,
    position_embedding_type=None,
    embedding_multiplier=2.0,
    residual_multiplier=0.5,
    attention_multiplier=0.2,
    logits_scaling=3.0,
)


FALCON_H1_TINY = dict(  # attention and Mamba2 in every layer; every muP multiplier away from 1
    mamba_d_ssm=128,
    mamba_n_heads=8,
    mamba_d_head=16,
    mamba_d_state=16,
    mamba_n_groups=2,
    mamba_chunk_size=8,
    mamba_rms_norm=True,
    embedding_multiplier=2.0,
    lm_head_multiplier=0.5,
    key_multiplier=0.7,
    attention_in_multiplier=1.2,
    attention_out_multiplier=0.8,
    ssm_in_multiplier=1.1,
    ssm_out_multiplier=0.9,
    ssm_multipliers=[1.0, 0.5, 1.5, 0.8, 1.2],
    mlp_multipliers=[1.3, 0.7],
)


LFM2_TINY = dict(  # short convolution, attention, convolution, attention (issue 52)
    num_hidden_layers=4,
    layer_types=["conv", "full_attention", "conv", "full_attention"],
    conv_L_cache=3,
    block_auto_adjust_ff_dim=False,
    norm_eps=1e-5,
)

LFM2_MOE_TINY = dict(  # LFM2's layers; layer 0 dense, then 4 experts (top 2), sigmoid router with a bias
    **LFM2_TINY,
    num_dense_layers=1,
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    routed_scaling_factor=1.5,
)

QWEN3_5_TINY = dict(  # Gated DeltaNet, gated attention, twice (issue 52); 2 key heads for 4 value heads
    num_hidden_layers=4,
    layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
    linear_num_value_heads=4,
    linear_num_key_heads=2,
    linear_key_head_dim=16,
    linear_value_head_dim=8,
    linear_conv_kernel_dim=4,
)

QWEN3_5_MOE_TINY = dict(  # Qwen3.5's layers, every MLP 4 experts (top 2) and a gated shared expert
    **QWEN3_5_TINY,
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=48,
)

QWEN3_NEXT_TINY = dict(  # fused DeltaNet projections; layer 1 dense (mlp_only_layers), unnormalized top-k
    **QWEN3_5_MOE_TINY,
    mlp_only_layers=[1],
    norm_topk_prob=False,
)

QWEN3_MOE_TINY = dict(  # 4 layers, the first dense (mlp_only_layers); 4 experts, top 2, renormalized
    num_hidden_layers=4,
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    mlp_only_layers=[0],
    norm_topk_prob=True,
)

QWEN2_MOE_TINY = dict(  # Qwen2's attention (q/k/v biases); 4 experts, top 2, and a gated shared expert
    num_hidden_layers=3,
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=48,
)

SMOLLM3_TINY = dict(num_hidden_layers=4)  # the 4th layer without rotary positions (NoPE)

PHI3_TINY = dict(  # half of each head rotated; LongRoPE switching past a 16-token original context
    original_max_position_embeddings=16,
    rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                     "short_factor": [1.0, 1.3, 1.7, 2.0], "long_factor": [1.5, 3.0, 6.0, 12.0],
                     "original_max_position_embeddings": 16},
)  # fmt: skip

GLM4_MOE_TINY = dict(  # a dense first layer, then 8 experts in 2 groups (top 2 of the best group), a shared
    num_hidden_layers=3,  # expert; q/k/v biases and norms, half of each head rotated
    n_routed_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    n_shared_experts=1,
    first_k_dense_replace=1,
    n_group=2,
    topk_group=1,
    routed_scaling_factor=1.5,
    attention_bias=True,
    use_qk_norm=True,
)

GPT_OSS_TINY = dict(  # sliding (window 4) and full layers alternating; 4 experts, top 2; biases everywhere
    num_hidden_layers=4,
    num_local_experts=4,
    num_experts_per_tok=2,
    intermediate_size=32,
    sliding_window=4,
    layer_types=["sliding_attention", "full_attention"] * 2,
    swiglu_limit=1.5,  # small enough that the random activations reach the clamps
)

NEMOTRON_H_TINY = dict(  # Mamba2, MoE, attention, MLP, Mamba2, MoE; 2 groups of 2 experts, latent MoE
    num_hidden_layers=None,
    layers_block_type=["linear_attention", "moe", "full_attention", "mlp", "linear_attention", "moe"],
    mamba_num_heads=8,
    mamba_head_dim=16,
    ssm_state_size=16,
    n_groups=2,
    chunk_size=8,
    n_routed_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    moe_shared_expert_intermediate_size=48,
    n_group=2,
    topk_group=1,
    routed_scaling_factor=1.5,
    moe_latent_size=32,
)

GEMMA4_TINY = dict(  # sliding and full layers, full ones wider with k = v; the last two share KV; MoE; PLE
    num_hidden_layers=6,
    layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2,
    sliding_window=4,
    global_head_dim=32,
    num_global_key_value_heads=1,
    attention_k_eq_v=True,
    num_kv_shared_layers=2,
    use_double_wide_mlp=True,
    hidden_size_per_layer_input=8,
    vocab_size_per_layer_input=320,
    enable_moe_block=True,
    num_experts=4,
    top_k_experts=2,
    moe_intermediate_size=32,
    final_logit_softcapping=30.0,
)

JAMBA_TINY = dict(  # Mamba1 at layers 0 and 2 (with MoE), attention at 1 and 3 (dense MLP)
    num_hidden_layers=4,
    attn_layer_period=2,
    attn_layer_offset=1,
    expert_layer_period=2,
    expert_layer_offset=0,
    num_experts=4,
    num_experts_per_tok=2,
    mamba_d_state=8,
    mamba_d_conv=4,
    mamba_expand=2,
)


def write_byte_tokenizer(folder: Path, eos: str | None = None, specials: tuple[str, ...] = ()) -> None:
    """A byte-level BPE with no merges: 256 byte tokens plus specials (``<eos>`` and
    ``specials``)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<eos>", *specials])
    tok.save(str(folder / "tokenizer.json"))
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",  # tokenizer.json as written, whatever the model type
        "eos_token": eos,
        "chat_template": "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}",
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))


def spm_corpus() -> list[str]:
    """Lines to train a SentencePiece model on: Python's own sources (fixed with the
    interpreter) and some scripts beyond Latin."""
    import inspect
    import json as json_module
    import textwrap

    lines = []
    for module in (json_module, inspect, textwrap):
        lines += [line for line in inspect.getsource(module).splitlines() if line.strip()]
    return lines + ["héllo wörld naïve café", "日本語のテキスト 中文 🙂", "Привет мир", "مرحبا ελληνικά"] * 20


def write_spm_tokenizer(folder: Path, vocab_size: int = 1000, symbols: tuple[str, ...] = ()) -> None:
    """A SentencePiece BPE (byte fallback, a space prefix, digits split, as llama's) as
    ``tokenizer.model``, with the tokenizer.json transformers converts it to. ``symbols``:
    user-defined pieces beyond ChatML's two (a model's image markers)."""
    import io

    import sentencepiece as spm
    from transformers import AutoTokenizer

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(spm_corpus()), model_writer=model, model_type="bpe", vocab_size=vocab_size,
        byte_fallback=True, normalization_rule_name="identity", remove_extra_whitespaces=False, split_digits=True,
        allow_whitespace_only_pieces=True, user_defined_symbols=["<|im_start|>", "<|im_end|>", *symbols], unk_id=0,
        bos_id=1, eos_id=2, pad_id=-1, minloglevel=2, num_threads=1,
    )  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.model").write_bytes(model.getvalue())
    config = {"tokenizer_class": "LlamaTokenizer", "add_bos_token": True, "bos_token": "<s>", "eos_token": "</s>",
              "unk_token": "<unk>", "legacy": True}  # fmt: skip
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    tok = AutoTokenizer.from_pretrained(folder)  # converted from tokenizer.model (needs protobuf)
    tok.chat_template = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    tok.save_pretrained(folder)
    added = {t: tok.convert_tokens_to_ids(t) for t in ("<|im_start|>", "<|im_end|>", *symbols)}
    (folder / "added_tokens.json").write_text(json.dumps(added))  # as transformers 4 wrote them, for the converter


def write_gemma4_tokenizer(folder: Path, vocab_size: int = 1000) -> None:
    """A tokenizer shaped as Gemma 4's tokenizer.json: BPE over raw UTF-8 with byte
        fallback (``<0xNN>`` tokens), spaces written as U+2581 by the normalizer, text split
        only at newlines, merges trained on ``spm_corpus``; ``<pad>``, ``<eos>``, ``<bos>``,
        ``<unk>``, ``<mask>`` first and ``<unusedN>`` filling the vocabulary to ``vocab_size``; ``<bos>`` put
    in front."""
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers

    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]  # Gemma 4's first five
    split = pre_tokenizers.Split(Regex("[^\n]+|[\n]+"), behavior="isolated")
    trained = Tokenizer(models.BPE())
    trained.normalizer = normalizers.Replace(" ", "\u2581")
    trained.pre_tokenizer = split
    trained.train_from_iterator(spm_corpus(), trainers.BpeTrainer(vocab_size=vocab_size - 300, show_progress=False))
    model = json.loads(trained.to_str())["model"]
    pieces = specials + [f"<0x{b:02X}>" for b in range(256)]
    pieces += [t for t, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1]) if t not in pieces]
    pieces += [f"<unused{i}>" for i in range(vocab_size - len(pieces))]
    added = [
        {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
         "special": True}
        for i, t in enumerate(pieces) if t in specials or t.startswith("<unused")
    ]  # fmt: skip
    spec = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
        "pre_tokenizer": json.loads(split.__getstate__()),
        "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}},
                           {"Sequence": {"id": "A", "type_id": 0}}], "pair": [{"Sequence": {"id": "A", "type_id": 0}}],
                           "special_tokens": {"<bos>": {"id": "<bos>", "ids": [2], "tokens": ["<bos>"]}}},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": True, "ignore_merges": False,
                  "vocab": {t: i for i, t in enumerate(pieces)}, "merges": model["merges"]},
    }  # fmt: skip
    Tokenizer.from_str(json.dumps(spec)).save(str(folder / "tokenizer.json"))
    config = {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>",
              "mask_token": "<mask>"}  # fmt: skip
    (folder / "tokenizer_config.json").write_text(json.dumps(config))


def make_checkpoint(
    folder: Path,
    arch: str = "llama",
    seed: int = 0,
    noise: float = 0.1,
    tokenizer: str = "bytes",
    max_shard_size: str | None = None,
    **overrides,
) -> Path:
    """``max_shard_size``: the weights in shards of that size with their index
    (``save_pretrained``'s sharding, as the hub's big folders come)."""
    import transformers

    classes = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
        "gemma2": (transformers.Gemma2Config, transformers.Gemma2ForCausalLM),
        "gemma3": (transformers.Gemma3TextConfig, transformers.Gemma3ForCausalLM),
        "gemma3n": (transformers.Gemma3nTextConfig, transformers.Gemma3nForCausalLM),
        "gemma4": (transformers.Gemma4TextConfig, transformers.Gemma4ForCausalLM),
        "mamba2": (transformers.Mamba2Config, transformers.Mamba2ForCausalLM),
        "granitemoehybrid": (transformers.GraniteMoeHybridConfig, transformers.GraniteMoeHybridForCausalLM),
        "falconh1": (transformers.FalconH1Config, transformers.FalconH1ForCausalLM),
        "jamba": (transformers.JambaConfig, transformers.JambaForCausalLM),
        "lfm2": (transformers.Lfm2Config, transformers.Lfm2ForCausalLM),
        "lfm2_moe": (transformers.Lfm2MoeConfig, transformers.Lfm2MoeForCausalLM),
        "nemotron_h": (transformers.NemotronHConfig, transformers.NemotronHForCausalLM),
        "qwen3_5": (transformers.Qwen3_5TextConfig, transformers.Qwen3_5ForCausalLM),
        "qwen3_5_moe": (transformers.Qwen3_5MoeTextConfig, transformers.Qwen3_5MoeForCausalLM),
        "qwen3_next": (transformers.Qwen3NextConfig, transformers.Qwen3NextForCausalLM),
        "qwen3_moe": (transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM),
        "qwen2_moe": (transformers.Qwen2MoeConfig, transformers.Qwen2MoeForCausalLM),
        "glm4_moe": (transformers.Glm4MoeConfig, transformers.Glm4MoeForCausalLM),
        "smollm3": (transformers.SmolLM3Config, transformers.SmolLM3ForCausalLM),
        "phi3": (transformers.Phi3Config, transformers.Phi3ForCausalLM),
        "gpt_oss": (transformers.GptOssConfig, transformers.GptOssForCausalLM),
    }
    if arch == "mamba2":  # no attention fields: only what Mamba2Config knows
        base = {k: BASE[k] for k in ("vocab_size", "hidden_size", "num_hidden_layers", "bos_token_id", "eos_token_id")}
        overrides = {**base, **MAMBA2_TINY, "pad_token_id": 0, **overrides}
    config_cls, model_cls = classes[arch]
    torch.manual_seed(seed)
    config = config_cls(**overrides) if arch == "mamba2" else config_cls(**{**BASE, **overrides})
    model = model_cls(config)
    with torch.no_grad():  # random biases and norms too, so every parameter matters
        for p in model.parameters():
            p.add_(torch.randn_like(p) * noise)
        for name, b in model.named_buffers():
            if name.endswith(("expert_bias", "e_score_correction_bias")):  # routing offsets (buffers) that steer
                b.add_(torch.randn_like(b) * 0.5)
            if name.endswith("layer_scalar"):  # Gemma 4's per-layer output scale (a buffer)
                b.add_(torch.randn_like(b) * noise)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, **({"max_shard_size": max_shard_size} if max_shard_size else {}))
    if tokenizer == "spm":
        write_spm_tokenizer(folder, config.vocab_size)
    elif tokenizer == "gemma4":
        write_gemma4_tokenizer(folder, config.vocab_size)
    else:
        write_byte_tokenizer(folder)
    return folder


def make_gemma3_vision(folder: Path, image: int, boi: int, eoi: int, per_image: int = 4, **text):
    """A tiny random Gemma 3 vision-language model (transformers' Gemma3ForConditionalGeneration:
    SigLIP on 28 x 28 images in 4 x 4 patches, pooled to ``per_image`` tokens; a 2-layer
    Gemma 3 with a sliding and a global layer), every parameter moved off its init, saved
    to ``folder``; returns the model (eval). ``text``: text_config fields over the defaults."""
    import transformers

    text = dict(
        vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=512, sliding_window=8,
        layer_types=["sliding_attention", "full_attention"],
    ) | text  # fmt: skip
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=28,
                  patch_size=7)  # fmt: skip
    config = transformers.Gemma3Config(
        text_config=text, vision_config=vision, mm_tokens_per_image=per_image, image_token_index=image,
        boi_token_index=boi, eoi_token_index=eoi,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.Gemma3ForConditionalGeneration(config)
    jitter(model)  # every parameter matters (norms, projector, biases)
    model.save_pretrained(folder)
    return model.eval()


VISION_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"


def write_vision_tokenizer(folder: Path) -> tuple[int, int, int, int]:
    """A byte tokenizer with Gemma 3's image tokens and a chat template (VISION_TEMPLATE)
    in ``folder``: returns (image, begin-of-image, end-of-image ids, vocabulary size)."""
    from tokenizers import Tokenizer

    folder.mkdir(parents=True, exist_ok=True)
    write_byte_tokenizer(folder)
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.add_special_tokens(["<start_of_image>", "<image_soft_token>", "<end_of_image>", "<pad1>", "<pad2>"])
    tok.save(str(folder / "tokenizer.json"))
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": VISION_TEMPLATE}  # as written
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    image, boi, eoi = (tok.token_to_id(t) for t in ("<image_soft_token>", "<start_of_image>", "<end_of_image>"))
    return image, boi, eoi, tok.get_vocab_size()


SMOLVLM_TOKENS = ["<fake_token_around_image>", "<global-img>", "<image>", "<end_of_utterance>"] + [
    f"<row_{r}_col_{c}>" for r in (1, 2, 3) for c in (1, 2, 3)
]


def make_smolvlm(folder: Path, arch: str = "SmolVLM", **text):
    """A tiny random SmolVLM (or Idefics3: ``arch``) with a byte tokenizer that knows its
    image tokens (SMOLVLM_TOKENS) and a preprocessor_config.json: SigLIP on 28 x 28 tiles
    in 7 x 7 patches, folded by 2 (4 tokens a frame), images resized to a longest edge of
    56 (up to 2 x 2 tiles); a 2-layer Llama. Every parameter moved off its init; returns
    (model (eval), tokenizer)."""
    import transformers
    from tokenizers import Tokenizer

    folder.mkdir(parents=True, exist_ok=True)
    write_byte_tokenizer(folder)
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.add_special_tokens(SMOLVLM_TOKENS)
    tok.save(str(folder / "tokenizer.json"))
    text = dict(
        vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=1024,
        eos_token_id=None, bos_token_id=None, pad_token_id=0,
    ) | text  # fmt: skip
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=28,
                  patch_size=7)  # fmt: skip
    config_cls = getattr(transformers, f"{arch}Config")
    image = tok.token_to_id("<image>")
    config = config_cls(text_config=text, vision_config=vision, scale_factor=2, image_token_id=image)
    torch.manual_seed(0)
    model = getattr(transformers, f"{arch}ForConditionalGeneration")(config)
    jitter(model)
    model.save_pretrained(folder)
    processor = {"image_processor_type": f"{arch}ImageProcessor", "do_image_splitting": True, "resample": 1,
                 "size": {"longest_edge": 56}, "max_image_size": {"longest_edge": 28},
                 "image_mean": [0.5] * 3, "image_std": [0.5] * 3}  # fmt: skip
    (folder / "preprocessor_config.json").write_text(json.dumps(processor))
    return model.eval(), tok


QWEN_VL_TOKENS = ["<|vision_start|>", "<|image_pad|>", "<|vision_end|>"]


def write_qwen_vl_tokenizer(folder: Path):
    """A byte tokenizer that knows Qwen's image tokens (QWEN_VL_TOKENS) in ``folder`` ->
    (the tokenizers.Tokenizer, their ids)."""
    from tokenizers import Tokenizer

    folder.mkdir(parents=True, exist_ok=True)
    write_byte_tokenizer(folder)
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.add_special_tokens(QWEN_VL_TOKENS)
    tok.save(str(folder / "tokenizer.json"))
    return tok, tuple(tok.token_to_id(t) for t in QWEN_VL_TOKENS)


def make_qwen2_5_vl(folder: Path, window: int = 56, **text):
    """A tiny random Qwen2.5-VL with a byte tokenizer that knows its image tokens
    (QWEN_VL_TOKENS) and a preprocessor_config.json: a 3-block vision transformer (the
    second sees the whole image, the others windows of ``window`` pixels: 2 x 2 tokens;
    a GGUF keeps no window size, llama.cpp takes 112), 14-pixel patches, images
    of 56 x 56 to 112 x 112 pixels (4 to 16 tokens); a 2-layer Qwen2 with M-RoPE
    sections (2, 3, 3). Every parameter moved off its init; returns (model (eval),
    tokenizer)."""
    import transformers

    tok, (start, image, end) = write_qwen_vl_tokenizer(folder)
    text = dict(
        vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024, eos_token_id=None,
        bos_token_id=None, pad_token_id=0,
        rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 10000.0},
    ) | text  # fmt: skip
    vision = dict(depth=3, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=text["hidden_size"],
                  patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=window,
                  fullatt_block_indexes=[1])  # fmt: skip
    config = transformers.Qwen2_5_VLConfig(
        text_config=text, vision_config=vision, image_token_id=image, vision_start_token_id=start,
        vision_end_token_id=end,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.Qwen2_5_VLForConditionalGeneration(config)
    jitter(model)
    model.save_pretrained(folder)
    processor = {"image_processor_type": "Qwen2VLImageProcessor", "min_pixels": 56 * 56, "max_pixels": 112 * 112,
                 "patch_size": 14, "merge_size": 2, "temporal_patch_size": 2,
                 "image_mean": [0.48145466, 0.4578275, 0.40821073],
                 "image_std": [0.26862954, 0.26130258, 0.27577711]}  # fmt: skip
    (folder / "preprocessor_config.json").write_text(json.dumps(processor))
    return model.eval(), tok


def make_qwen3_5_vl(folder: Path, moe: bool = False) -> tuple:
    """A tiny random Qwen3.5 (or Qwen3.5-MoE) with images, in the published layout
    (``model.language_model.*``, ``model.visual.*``), a byte tokenizer that knows the
    image tokens (QWEN_VL_TOKENS) and a preprocessor_config.json: a 2-block vision
    transformer over 16-pixel patches with a learned 6 x 6 position table (resampled to
    every grid), images of 64 x 64 to 128 x 128 pixels (4 to 16 tokens); the language
    model QWEN3_5_TINY (or _MOE_) with partial rotary and interleaved M-RoPE sections
    (1, 1, 1). Every parameter moved off its init; returns (model (eval), tokenizer)."""
    import transformers

    tok, (start, image, end) = write_qwen_vl_tokenizer(folder)
    rope = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
            "mrope_section": [1, 1, 1], "mrope_interleaved": True}  # fmt: skip
    text = {**BASE, **(QWEN3_5_MOE_TINY if moe else QWEN3_5_TINY), "rope_parameters": rope, "pad_token_id": 0}
    vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=text["hidden_size"],
                  patch_size=16, spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=36)  # fmt: skip
    kind = "Qwen3_5Moe" if moe else "Qwen3_5"
    config = getattr(transformers, f"{kind}Config")(
        text_config=text, vision_config=vision, image_token_id=image, vision_start_token_id=start,
        vision_end_token_id=end,
    )  # fmt: skip
    torch.manual_seed(0)
    model = getattr(transformers, f"{kind}ForConditionalGeneration")(config)
    jitter(model)
    model.save_pretrained(folder)
    processor = {"image_processor_type": "Qwen2VLImageProcessor", "size": {"shortest_edge": 64 * 64,
                 "longest_edge": 128 * 128}, "patch_size": 16, "merge_size": 2, "temporal_patch_size": 2,
                 "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}  # fmt: skip
    (folder / "preprocessor_config.json").write_text(json.dumps(processor))
    return model.eval(), tok


FIM_TOKENS = ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|repo_name|>", "<|file_sep|>"]


def add_fim_tokens(folder: Path) -> Path:
    """Give a checkpoint's tokenizer Qwen2.5-Coder's fill-in-the-middle tokens."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.add_special_tokens(FIM_TOKENS)
    tok.save(str(folder / "tokenizer.json"))
    return folder


def load_reference(folder: Path):
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def greedy_reference(model, prompt: list[int], n: int) -> tuple[list[int], torch.Tensor]:
    """transformers' greedy continuation of ``prompt``: (n tokens, logits [n, vocab])."""
    out = model.generate(
        torch.tensor([prompt]),
        attention_mask=torch.ones(1, len(prompt), dtype=torch.long),  # pad_token_id 0 must not mask token 0
        max_new_tokens=n,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
        eos_token_id=None,
        pad_token_id=0,
    )
    return out.sequences[0, len(prompt) :].tolist(), torch.stack(out.logits)[:, 0]


LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_adapter(folder, out, alpha: float, seed: int = 0):
    """A PEFT LoRA on every projection with random A and B (PEFT starts B at zero)."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(load_reference(folder), LoraConfig(r=4, lora_alpha=alpha, target_modules=LORA_TARGETS))
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn_like(p) * 0.2)
    model.save_pretrained(out)
    return model.merge_and_unload().eval()


def make_published_qwen3_5_moe(folder: Path) -> Path:
    """A tiny Qwen3.5-MoE folder laid out as the published ones are: the multimodal
    class (``model.language_model.*``, a vision tower), experts stacked
    (``experts.gate_up_proj``), a multi-token-prediction tensor, interleaved M-RoPE
    sections and ``full_attention_interval`` instead of a layer list."""
    import transformers
    from safetensors.torch import load_file, save_file

    text = {**BASE, **QWEN3_5_MOE_TINY, "rope_parameters": {
        "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
        "mrope_section": [1, 1, 0], "mrope_interleaved": True}}  # fmt: skip
    del text["layer_types"]
    text["full_attention_interval"] = 2
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=4)
    torch.manual_seed(0)
    config = transformers.Qwen3_5MoeConfig(text_config=text, vision_config=vision)
    model = transformers.Qwen3_5MoeForConditionalGeneration(config)
    jitter(model)
    model.save_pretrained(folder)
    weights = load_file(str(folder / "model.safetensors"))
    stacked = {}
    for name in [n for n in weights if ".experts.0." in n]:
        base, kind = name.split(".experts.0.")
        kind = kind.removesuffix(".weight")
        each = [weights.pop(f"{base}.experts.{e}.{kind}.weight") for e in range(text["num_experts"])]
        stacked.setdefault(base, {})[kind] = torch.stack(each)  # [E, out, in]
    for base, kinds in stacked.items():
        weights[f"{base}.experts.gate_up_proj"] = torch.cat([kinds.pop("gate_proj"), kinds.pop("up_proj")], dim=1)
        weights[f"{base}.experts.down_proj"] = kinds.pop("down_proj")
    weights["mtp.fc.weight"] = torch.zeros(64, 128)
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    assert "layer_types" not in config["text_config"] or config["text_config"].pop("layer_types")
    config["text_config"]["full_attention_interval"] = 2
    (folder / "config.json").write_text(json.dumps(config))
    write_byte_tokenizer(folder)
    return folder


def make_published_gemma4(folder: Path) -> Path:
    """A tiny Gemma 4 folder as published: the multimodal class (``model.language_model.*``,
    a vision tower), the full layers' shape as ``global_head_dim`` and
    ``num_global_key_value_heads`` (not transformers 5.24's ``per_layer_config``)."""
    import transformers

    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, head_dim=16)
    torch.manual_seed(0)
    text = {**BASE, **GEMMA4_TINY, "pad_token_id": 0}  # the multimodal model masks its placeholders with it
    config = transformers.Gemma4Config(text_config=text, vision_config=vision, audio_config=None)
    model = transformers.Gemma4ForConditionalGeneration(config)
    jitter(model)
    model.save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    text = config["text_config"]
    del text["per_layer_config"]
    text.update(global_head_dim=GEMMA4_TINY["global_head_dim"], num_global_key_value_heads=1)
    (folder / "config.json").write_text(json.dumps(config))
    write_byte_tokenizer(folder)
    return folder
