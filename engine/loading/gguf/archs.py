"""What each GGUF architecture is as a Hugging Face checkpoint: the config.json its
metadata stands for, and how each Hugging Face tensor is found (renamed through the
``gguf`` package's ``TensorNameMap``, then the architecture's hook in tensors.py undoes
what the converter changed)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from engine.loading.gguf.tensors import (
    GGUFMetadata,
    Read,
    gemma3n_tensor,
    gemma4_tensor,
    gemma_tensor,
    granite_tensor,
    jamba_tensor,
    kv_heads,
    lfm2_tensor,
    llama_tensor,
    qwen35_tensor,
    ssm_tensor,
)
from engine.models.qwen3_5 import TILED


@dataclass(frozen=True)
class GGUFArch:
    hf_class: str
    config: Callable[[GGUFMetadata], dict]
    # (checkpoint, HF name, GGUF name the table gives, read) -> the HF tensor, or None
    # where the plain renamed tensor is right
    tensor: Callable[[GGUFMetadata, str, str, Read], torch.Tensor | None] | None = None
    # whether 2-D weights may stay in blocks (every architecture today): a ``tensor``
    # hook only moves the rows of a kept weight; what it rebuilds (Granite's split
    # gate/up, Jamba's and Gemma 3n's stacked tensors) is read in float, as the plan
    # keeps only weights stored under their own name
    keeps_blocks: bool = True


def _base(ck: GGUFMetadata, model_type: str) -> dict:
    a = ck.arch
    n_head = ck.get(f"{a}.attention.head_count") or 0
    hidden = ck.get(f"{a}.embedding_length")
    cfg = {
        "architectures": [ARCHITECTURES[a].hf_class],
        "model_type": model_type,
        "hidden_size": hidden,
        "intermediate_size": ck.get(f"{a}.feed_forward_length"),
        "num_hidden_layers": ck.get(f"{a}.block_count"),
        "num_attention_heads": n_head,
        "num_key_value_heads": max(kv_heads(ck)) or n_head,
        "head_dim": ck.get(f"{a}.attention.key_length") or (hidden // n_head if n_head else None),
        "rms_norm_eps": ck.get(f"{a}.attention.layer_norm_rms_epsilon"),
        "max_position_embeddings": ck.get(f"{a}.context_length"),
        "vocab_size": ck.vocab_size,
        "rope_theta": ck.get(f"{a}.rope.freq_base", 10000.0),
        "tie_word_embeddings": "output.weight" not in ck.tensors,
        "attention_bias": "blk.0.attn_q.bias" in ck.tensors,
        "torch_dtype": "float32",
    }
    eos = ck.get("tokenizer.ggml.eos_token_id")
    if eos is not None:
        cfg["eos_token_id"] = eos
    scaling, factor = ck.get(f"{a}.rope.scaling.type"), ck.get(f"{a}.rope.scaling.factor")
    if scaling == "linear" and factor:
        cfg["rope_scaling"] = {"rope_type": "linear", "factor": factor}
    return {k: v for k, v in cfg.items() if v is not None}


def _llama_like(model_type: str) -> Callable[[GGUFMetadata], dict]:
    def config(ck: GGUFMetadata) -> dict:
        cfg = _base(ck, model_type)
        window = ck.get(f"{ck.arch}.attention.sliding_window")
        if window:
            cfg["sliding_window"] = window
        sections = ck.get(f"{ck.arch}.rope.dimension_sections")  # Qwen2-VL's M-RoPE (qwen2vl): 4, the last 0
        if sections:
            cfg["rope_parameters"] = {
                "rope_type": "default",
                "rope_theta": cfg["rope_theta"],
                "mrope_section": sections[:3],
            }
        return cfg

    return config


def _gemma(model_type: str) -> Callable[[GGUFMetadata], dict]:
    """Gemma 2 and 3. The file does not say which layers slide nor the query scale:
    llama.cpp's rules stand in (Gemma 2 alternates, Gemma 3 makes every 6th layer
    global unless a pattern is given; the scale is 1/sqrt(head_dim), or
    1/sqrt(hidden/heads) for the 27B models, 46 and 62 layers)."""

    def config(ck: GGUFMetadata) -> dict:
        a = ck.arch
        cfg = _base(ck, model_type)
        n = cfg["num_hidden_layers"]
        pattern = ck.get(f"{a}.attention.sliding_window_pattern")
        if isinstance(pattern, list):
            slides = [bool(x) for x in pattern]
        else:
            every = 2 if a == "gemma2" else int(pattern or 6)
            slides = [(i + 1) % every != 0 for i in range(n)]
        cfg["layer_types"] = ["sliding_attention" if s else "full_attention" for s in slides]
        cfg["sliding_window"] = ck.get(f"{a}.attention.sliding_window") or 4096
        scale = ck.get(f"{a}.attention.scale")
        wide = n in (46, 62)
        cfg["query_pre_attn_scalar"] = (
            1.0 / scale**2 if scale else (cfg["hidden_size"] // cfg["num_attention_heads"] if wide else cfg["head_dim"])
        )
        for key in ("attn_logit_softcapping", "final_logit_softcapping"):
            if ck.get(f"{a}.{key}") is not None:
                cfg[key] = ck.get(f"{a}.{key}")
        if a != "gemma2":  # sliding layers' own rope base
            cfg["rope_local_base_freq"] = ck.get(f"{a}.rope.freq_base_swa", 10000.0)
        return cfg

    return config


def _gemma3n(ck: GGUFMetadata) -> dict:
    a = ck.arch
    cfg = _gemma("gemma3n_text")(ck)
    del cfg["query_pre_attn_scalar"]  # Gemma 3n does not scale queries (its q/k norms do)
    scales = ck.get(f"{a}.activation_sparsity_scale") or [-math.inf] * cfg["num_hidden_layers"]
    cfg.update(
        intermediate_size=ck.get(f"{a}.feed_forward_length"),
        activation_sparsity_pattern=[0.5 * (1 + math.erf(s / math.sqrt(2))) for s in scales],  # back from icdf
        altup_active_idx=ck.get(f"{a}.altup.active_idx", 0),
        altup_num_inputs=ck.get(f"{a}.altup.num_inputs", 4),
        hidden_size_per_layer_input=ck.get(f"{a}.embedding_length_per_layer_input"),
        num_kv_shared_layers=ck.get(f"{a}.attention.shared_kv_layers", 0),
        laurel_rank=ck.tensors["blk.0.laurel_l.weight"][1][0],
        vocab_size_per_layer_input=ck.tensors["per_layer_token_embd.weight"][1][0],
    )
    return cfg


def _ssm(ck: GGUFMetadata, prefix: str) -> dict:
    """Mamba2 mixer fields (``prefix``: "" for Mamba2, "mamba_" for the hybrids)."""
    a = ck.arch
    inner, heads = ck.get(f"{a}.ssm.inner_size"), ck.get(f"{a}.ssm.time_step_rank")
    layer = next(i for i in range(ck.get(f"{a}.block_count")) if f"blk.{i}.ssm_in.weight" in ck.tensors)
    return {
        f"{prefix}n_heads" if prefix else "num_heads": heads,
        f"{prefix}d_head" if prefix else "head_dim": inner // heads,
        f"{prefix}d_state" if prefix else "state_size": ck.get(f"{a}.ssm.state_size"),
        f"{prefix}n_groups" if prefix else "n_groups": ck.get(f"{a}.ssm.group_count") or 1,
        f"{prefix}d_conv" if prefix else "conv_kernel": ck.get(f"{a}.ssm.conv_kernel"),
        f"{prefix}expand" if prefix else "expand": inner // ck.get(f"{a}.embedding_length"),
        f"{prefix}conv_bias" if prefix else "use_conv_bias": f"blk.{layer}.ssm_conv1d.bias" in ck.tensors,
        f"{prefix}proj_bias" if prefix else "use_bias": f"blk.{layer}.ssm_in.bias" in ck.tensors,
    }


def _mamba2(ck: GGUFMetadata) -> dict:
    a = ck.arch
    return {
        "architectures": ["Mamba2ForCausalLM"],
        "model_type": "mamba2",
        "hidden_size": ck.get(f"{a}.embedding_length"),
        "num_hidden_layers": ck.get(f"{a}.block_count"),
        "vocab_size": ck.vocab_size,
        "layer_norm_epsilon": ck.get(f"{a}.attention.layer_norm_rms_epsilon"),
        "tie_word_embeddings": "output.weight" not in ck.tensors,
        "torch_dtype": "float32",
        **_ssm(ck, ""),
    }


def _granite_hybrid(ck: GGUFMetadata) -> dict:
    a = ck.arch
    cfg = {**_base(ck, "granitemoehybrid"), **_ssm(ck, "mamba_")}
    cfg["layer_types"] = ["attention" if k else "mamba" for k in kv_heads(ck)]
    cfg["mamba_d_ssm"] = ck.get(f"{a}.ssm.inner_size")
    cfg["position_embedding_type"] = "rope" if ck.get(f"{a}.rope.scaling.finetuned") else None
    pairs = (("embedding_multiplier", "embedding_scale"), ("residual_multiplier", "residual_scale"),
             ("attention_multiplier", "attention.scale"), ("logits_scaling", "logit_scale"),
             ("num_local_experts", "expert_count"), ("num_experts_per_tok", "expert_used_count"),
             ("shared_intermediate_size", "expert_shared_feed_forward_length"))  # fmt: skip
    for hf_key, key in pairs:
        if ck.get(f"{a}.{key}") is not None:
            cfg[hf_key] = ck.get(f"{a}.{key}")
    return cfg


def _falcon_h1(ck: GGUFMetadata) -> dict:
    """The converter multiplies every muP multiplier into the weights: all stay 1 here."""
    cfg = {**_base(ck, "falcon_h1"), **_ssm(ck, "mamba_")}
    cfg["mamba_d_ssm"] = ck.get(f"{ck.arch}.ssm.inner_size")
    cfg["mamba_rms_norm"] = "blk.0.ssm_norm.weight" in ck.tensors
    cfg["projectors_bias"] = "blk.0.ssm_out.bias" in ck.tensors
    return cfg


def _every(layers: list[int], n: int) -> tuple[int, int]:
    """(period, offset) of a regular set of layer indices."""
    if not layers:
        return n + 1, n
    return (layers[1] - layers[0] if len(layers) > 1 else n), layers[0]


def _jamba(ck: GGUFMetadata) -> dict:
    a = ck.arch
    cfg = _base(ck, "jamba")
    n = cfg["num_hidden_layers"]
    attn = [i for i, k in enumerate(kv_heads(ck)) if k]
    moe = [i for i in range(n) if f"blk.{i}.ffn_gate_exps.weight" in ck.tensors]
    cfg["attn_layer_period"], cfg["attn_layer_offset"] = _every(attn, n)
    cfg["expert_layer_period"], cfg["expert_layer_offset"] = _every(moe, n)
    layer = next(i for i in range(n) if f"blk.{i}.ssm_in.weight" in ck.tensors)
    cfg.update(
        num_experts=ck.get(f"{a}.expert_count") or 1,
        num_experts_per_tok=ck.get(f"{a}.expert_used_count") or 1,
        mamba_d_state=ck.get(f"{a}.ssm.state_size"),
        mamba_d_conv=ck.get(f"{a}.ssm.conv_kernel"),
        mamba_expand=ck.get(f"{a}.ssm.inner_size") // cfg["hidden_size"],
        mamba_dt_rank=ck.get(f"{a}.ssm.time_step_rank"),
        mamba_conv_bias=f"blk.{layer}.ssm_conv1d.bias" in ck.tensors,
        mamba_proj_bias=f"blk.{layer}.ssm_in.bias" in ck.tensors,
    )
    return cfg


def _lfm2(ck: GGUFMetadata) -> dict:
    """LFM2 and LFM2-MoE: the converter writes 0 KV heads for the short-convolution
    layers and the feed-forward size already adjusted (``block_auto_adjust_ff_dim`` off
    here); of the experts, neither a weight scale nor whether the chosen weights are
    renormalized (llama.cpp's rule stands in: renormalized, unscaled)."""
    a = ck.arch
    cfg = _base(ck, "lfm2_moe" if a == "lfm2moe" else "lfm2")
    cfg["layer_types"] = ["full_attention" if k else "conv" for k in kv_heads(ck)]
    cfg.update(conv_L_cache=ck.get(f"{a}.shortconv.l_cache", 3), block_auto_adjust_ff_dim=False)
    cfg["conv_bias"] = "blk.0.shortconv.in_proj.bias" in ck.tensors
    if ck.get(f"{a}.expert_count"):
        cfg.update(
            num_experts=ck.get(f"{a}.expert_count"),
            num_experts_per_tok=ck.get(f"{a}.expert_used_count"),
            moe_intermediate_size=ck.get(f"{a}.expert_feed_forward_length"),
            num_dense_layers=ck.get(f"{a}.leading_dense_block_count") or 0,
            use_expert_bias="blk.{}.exp_probs_b.bias".format(cfg["num_hidden_layers"] - 1) in ck.tensors,
            norm_topk_prob=True,
            routed_scaling_factor=1.0,
        )
    return cfg


def _gemma4(ck: GGUFMetadata) -> dict:
    """Gemma 4: per-layer KV heads and feed-forward widths, the two head sizes
    (``key_length`` full, ``key_length_swa`` sliding), k = v where a full layer that
    keeps its own cache has no ``attn_v``, the full layers' rotated share from
    ``rope_freqs`` (1 where an angle turns, 1e30 where it stands)."""
    a = ck.arch
    cfg = _base(ck, "gemma4_text")
    n = cfg["num_hidden_layers"]
    slides = [bool(x) for x in ck.get(f"{a}.attention.sliding_window_pattern")]
    heads, ffn = kv_heads(ck), ck.get(f"{a}.feed_forward_length")
    ffn = ffn if isinstance(ffn, list) else [ffn] * n
    full_head, swa_head = ck.get(f"{a}.attention.key_length"), ck.get(f"{a}.attention.key_length_swa")
    shared = ck.get(f"{a}.attention.shared_kv_layers") or 0
    own_full = [i for i in range(n - shared) if not slides[i]]
    turning = full_head // 2
    if "rope_freqs.weight" in ck.tensors:
        turning = int((ck.small_tensor("rope_freqs.weight") < 2).sum())
    cfg.update(
        layer_types=["sliding_attention" if s else "full_attention" for s in slides],
        sliding_window=ck.get(f"{a}.attention.sliding_window"),
        head_dim=swa_head,
        num_key_value_heads=next((heads[i] for i in range(n) if slides[i]), heads[0]),
        per_layer_config={
            str(i): {"head_dim": swa_head if slides[i] else full_head, "num_key_value_heads": heads[i]}
            for i in range(n)
        },
        attention_k_eq_v=bool(own_full) and f"blk.{own_full[0]}.attn_v.weight" not in ck.tensors,
        intermediate_size=ffn[0],
        use_double_wide_mlp=any(f == 2 * ffn[0] for f in ffn[n - shared :]) if shared else False,
        num_kv_shared_layers=shared,
        hidden_size_per_layer_input=ck.get(f"{a}.embedding_length_per_layer_input") or 0,
        final_logit_softcapping=ck.get(f"{a}.final_logit_softcapping"),
        rope_parameters={
            "full_attention": {"rope_type": "proportional", "rope_theta": cfg["rope_theta"],
                               "partial_rotary_factor": 2 * turning / full_head},
            "sliding_attention": {"rope_type": "default", "rope_theta": ck.get(f"{a}.rope.freq_base_swa", 10000.0)},
        },
    )  # fmt: skip
    if "per_layer_token_embd.weight" in ck.tensors:
        cfg["vocab_size_per_layer_input"] = ck.tensors["per_layer_token_embd.weight"][1][0]
    if ck.get(f"{a}.expert_count"):
        cfg.update(
            enable_moe_block=True,
            num_experts=ck.get(f"{a}.expert_count"),
            top_k_experts=ck.get(f"{a}.expert_used_count"),
            moe_intermediate_size=ck.get(f"{a}.expert_feed_forward_length"),
        )
    return cfg


def _nemotron_h(ck: GGUFMetadata) -> dict:
    """Nemotron-H: each block's mixer from what the file holds (KV heads: attention;
    ``ssm_in``: Mamba2; stacked experts: MoE; else the MLP); the MLP's width from its
    tensor (the converter writes 0 for it); ``time_step_min`` is not written (its
    default, 0.001, stands in)."""
    a = ck.arch
    cfg = _base(ck, "nemotron_h")
    n = cfg.pop("num_hidden_layers")
    heads = kv_heads(ck)

    def kind(i: int) -> str:
        if heads[i]:
            return "full_attention"
        if f"blk.{i}.ssm_in.weight" in ck.tensors:
            return "linear_attention"
        return "moe" if f"blk.{i}.ffn_up_exps.weight" in ck.tensors else "mlp"

    cfg["layers_block_type"] = [kind(i) for i in range(n)]
    dense = next((i for i, k in enumerate(cfg["layers_block_type"]) if k == "mlp"), None)
    cfg["intermediate_size"] = ck.tensors[f"blk.{dense}.ffn_up.weight"][1][0] if dense is not None else 1
    inner, ssm_heads = ck.get(f"{a}.ssm.inner_size"), ck.get(f"{a}.ssm.time_step_rank")
    cfg.update(
        mamba_num_heads=ssm_heads,
        mamba_head_dim=inner // ssm_heads if ssm_heads else 1,
        ssm_state_size=ck.get(f"{a}.ssm.state_size"),
        n_groups=ck.get(f"{a}.ssm.group_count") or 1,
        conv_kernel=ck.get(f"{a}.ssm.conv_kernel") or 4,
        layer_norm_epsilon=ck.get(f"{a}.attention.layer_norm_epsilon"),
        use_conv_bias=any(name.endswith("ssm_conv1d.bias") for name in ck.tensors),
    )
    if ck.get(f"{a}.expert_count"):
        cfg.update(
            n_routed_experts=ck.get(f"{a}.expert_count"),
            num_experts_per_tok=ck.get(f"{a}.expert_used_count"),
            n_group=ck.get(f"{a}.expert_group_count") or 1,
            topk_group=ck.get(f"{a}.expert_group_used_count") or 1,
            moe_intermediate_size=ck.get(f"{a}.expert_feed_forward_length"),
            moe_shared_expert_intermediate_size=ck.get(f"{a}.expert_shared_feed_forward_length"),
            norm_topk_prob=bool(ck.get(f"{a}.expert_weights_norm", True)),
            routed_scaling_factor=ck.get(f"{a}.expert_weights_scale") or 1.0,
            moe_latent_size=ck.get(f"{a}.moe_latent_size"),
        )
    return cfg


QWEN35_TYPES = {"qwen35": "qwen3_5_text", "qwen35moe": "qwen3_5_moe_text", "qwen3next": "qwen3_next"}


def _qwen35(ck: GGUFMetadata) -> dict:
    """Qwen3.5 text (dense and MoE) and Qwen3-Next: Gated DeltaNet sizes in the file's
    ``ssm.*`` keys (key heads as groups, their width as the state size, value heads as
    the time-step rank), the rotary part of each head as ``rope.dimension_count``; the
    experts' sizes, dense layers where no ``ffn_gate_exps`` is written, the chosen
    experts' weights renormalized (llama.cpp's rule: the file does not say)."""
    a = ck.arch
    cfg = _base(ck, QWEN35_TYPES[a])
    cfg[TILED] = a != "qwen3next"  # the converter tiles Qwen3.5's value heads (not Qwen3-Next's)
    cfg["layer_types"] = [
        "linear_attention" if r else "full_attention" for r in ck.get(f"{a}.attention.recurrent_layers")
    ]
    heads = ck.get(f"{a}.ssm.time_step_rank")
    cfg.update(
        linear_num_key_heads=ck.get(f"{a}.ssm.group_count"),
        linear_key_head_dim=ck.get(f"{a}.ssm.state_size"),
        linear_num_value_heads=heads,
        linear_value_head_dim=ck.get(f"{a}.ssm.inner_size") // heads,
        linear_conv_kernel_dim=ck.get(f"{a}.ssm.conv_kernel"),
    )
    if ck.get(f"{a}.expert_count"):
        n = cfg["num_hidden_layers"]
        cfg.update(
            num_experts=ck.get(f"{a}.expert_count"),
            num_experts_per_tok=ck.get(f"{a}.expert_used_count"),
            moe_intermediate_size=ck.get(f"{a}.expert_feed_forward_length"),
            shared_expert_intermediate_size=ck.get(f"{a}.expert_shared_feed_forward_length"),
            mlp_only_layers=[i for i in range(n) if f"blk.{i}.ffn_gate_exps.weight" not in ck.tensors],
            norm_topk_prob=True,
        )
    rotated = ck.get(f"{a}.rope.dimension_count") or cfg["head_dim"]
    cfg["rope_parameters"] = {
        "rope_type": "default",
        "rope_theta": cfg["rope_theta"],
        "partial_rotary_factor": rotated / cfg["head_dim"],
    }
    sections = ck.get(f"{a}.rope.dimension_sections")  # interleaved M-RoPE's (time, height, width, 0)
    if sections:
        cfg["rope_parameters"]["mrope_section"] = [int(s) for s in sections[:3]]
    return cfg


def gguf_name(ck: GGUFMetadata, names: Any, hf_name: str) -> str | None:
    """The GGUF tensor the converter wrote for ``hf_name`` (None: none matches)."""
    lookup = re.sub(r"\.dt_bias$", ".dt_proj.bias", hf_name)  # the converter renames these first
    lookup = re.sub(r"_scale$", "_scale.weight", lookup)
    lookup = re.sub(r"e_score_correction_bias$", "e_score_correction.bias", lookup)  # the converter's rename
    found = names.get_name(lookup, try_suffixes=(".weight", ".bias"))
    if found is not None and found not in ck.tensors and found.endswith(".weight") and found[:-7] in ck.tensors:
        return found[:-7]  # a few names are written without ".weight" (Falcon-H1's ffn_norm)
    for suffix in (".bias", ".weight"):  # an HF name without a suffix written with one (LFM2-MoE's
        if found is not None and found not in ck.tensors and f"{found}{suffix}" in ck.tensors:  # expert_bias,
            return f"{found}{suffix}"  # Gemma 4's layer_scalar)
    return found


ARCHITECTURES: dict[str, GGUFArch] = {
    "llama": GGUFArch("LlamaForCausalLM", _llama_like("llama"), llama_tensor),
    "qwen2": GGUFArch("Qwen2ForCausalLM", _llama_like("qwen2")),
    "qwen2vl": GGUFArch("Qwen2ForCausalLM", _llama_like("qwen2")),  # Qwen2-VL's language model (M-RoPE sections)
    "qwen3": GGUFArch("Qwen3ForCausalLM", _llama_like("qwen3")),
    "gemma2": GGUFArch("Gemma2ForCausalLM", _gemma("gemma2"), gemma_tensor),
    "gemma3": GGUFArch("Gemma3ForCausalLM", _gemma("gemma3_text"), gemma_tensor),
    "gemma3n": GGUFArch("Gemma3nForCausalLM", _gemma3n, gemma3n_tensor),
    "gemma4": GGUFArch("Gemma4ForCausalLM", _gemma4, gemma4_tensor),
    "mamba2": GGUFArch("Mamba2ForCausalLM", _mamba2, ssm_tensor),
    "granitehybrid": GGUFArch("GraniteMoeHybridForCausalLM", _granite_hybrid, granite_tensor),
    "falcon-h1": GGUFArch("FalconH1ForCausalLM", _falcon_h1, ssm_tensor),
    "jamba": GGUFArch("JambaForCausalLM", _jamba, jamba_tensor),
    "lfm2": GGUFArch("Lfm2ForCausalLM", _lfm2, lfm2_tensor),
    "lfm2moe": GGUFArch("Lfm2MoeForCausalLM", _lfm2, lfm2_tensor),
    # Mamba2's tensors, stacked experts; with transformers 5 installed the converter writes
    # every Nemotron-H as nemotron_h_moe (its config always lists expert fields)
    "nemotron_h": GGUFArch("NemotronHForCausalLM", _nemotron_h, jamba_tensor),
    "nemotron_h_moe": GGUFArch("NemotronHForCausalLM", _nemotron_h, jamba_tensor),
    "qwen35": GGUFArch("Qwen3_5ForCausalLM", _qwen35, qwen35_tensor),
    "qwen35moe": GGUFArch("Qwen3_5MoeForCausalLM", _qwen35, qwen35_tensor),
    "qwen3next": GGUFArch("Qwen3NextForCausalLM", _qwen35, qwen35_tensor),
}
