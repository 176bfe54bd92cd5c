"""One tiny checkpoint per family the README names, shaped as the files users have:

- the config from transformers' own config class with size arguments only (and the
  layer pattern where a 2- to 4-layer model would otherwise hold one kind of layer),
  saved by ``save_pretrained``: no field added or edited by hand;
- the family's tokenizer: a vocabulary trained with its real split (the name llama.cpp's
  converter writes for it, tests/family_tokenizers.py) or its SentencePiece kind, its
  special tokens, the class its tokenizer_config.json names;
- its chat template from llama.cpp's corpus of real ones (models/templates/);
- the GGUF the pinned converter writes from the folder, with the family's
  ``tokenizer.ggml.pre`` (a vocabulary this small has no hash the converter knows) and
  no metadata edited.

Where the family's real choice is not known here (no hub), the table says what was
taken instead.
"""

from __future__ import annotations

import inspect
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

VOCAB = 640  # the tokenizer's size and the config's vocab_size
SIZES = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=2048)  # fmt: skip
CHATML = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


@dataclass(frozen=True)
class Family:
    """``tokenizer``: ``bpe`` (byte-level, split by ``pre``), ``spm`` (SentencePiece BPE
    with a space in front, Llama 2's), ``gemma-spm`` (Gemma's, no space in front),
    ``gemma4`` (Gemma 4's BPE over raw UTF-8). ``eos``: the token generation ends at."""

    config: str
    model: str
    template: str | None
    tokenizer: str = "bpe"
    pre: str | None = None
    tokenizer_class: str = "PreTrainedTokenizerFast"
    specials: tuple[str, ...] = CHATML
    bos: str | None = None
    eos: str = "<|im_end|>"
    sizes: dict = field(default_factory=dict)
    flags: tuple[str, ...] = ()
    rstrip: tuple[str, ...] = ()

    def as_file(self, folder: Path, dst: Path) -> Path:
        """The folder as its GGUF file describes the model, for the oracle: ``folder``
        itself, or a copy where the converter drops a field llama.cpp then reads its own
        way (gpt-oss: YaRN's ``truncate: false``; llama.cpp floors and ceils the
        correction range, transformers' ``truncate: true``)."""
        if self.config != "GptOssConfig":
            return folder
        shutil.copytree(folder, dst)
        cfg = json.loads((dst / "config.json").read_text())
        cfg["rope_parameters"]["truncate"] = True
        (dst / "config.json").write_text(json.dumps(cfg))
        return dst


LLAMA3_SPECIALS = ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                   "<|eom_id|>", "<|python_tag|>")  # fmt: skip
GPT_OSS_SPECIALS = ("<|startoftext|>", "<|endoftext|>", "<|start|>", "<|message|>", "<|end|>", "<|channel|>",
                    "<|return|>", "<|call|>", "<|constrain|>")  # fmt: skip
# the default pattern: 3 Gated DeltaNet layers, then attention; key and value heads of one
# size, as every published Qwen3.5 / Qwen3-Next (llama.cpp's loader assumes it)
QWEN35 = dict(
    num_hidden_layers=4,
    linear_num_value_heads=4,
    linear_num_key_heads=2,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
)  # fmt: skip
# M-RoPE's sections cut to a 16-wide head (the class's default, [11, 11, 10], fits Qwen3.5's
# 256-wide heads: llama.cpp refuses sections wider than the rotary part)
QWEN35_ROPE = {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.5,
               "mrope_section": [1, 1, 1], "mrope_interleaved": True}  # fmt: skip
EXPERTS = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
GEMMA_TURNS = ("<start_of_turn>", "<end_of_turn>")
GEMMA3N_LAYERS = (["sliding_attention"] * 4 + ["full_attention"]) * 4 + ["sliding_attention"] * 2
# Phi-3's: those after <|endoftext|> swallow the whitespace after them (its tokenizer.json's rstrip)
PHI3_SPECIALS = ("<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>")

FAMILIES: dict[str, Family] = {
    "llama": Family("LlamaConfig", "LlamaForCausalLM", "meta-llama-Llama-3.1-8B-Instruct", pre="llama-bpe",
                    specials=LLAMA3_SPECIALS, bos="<|begin_of_text|>", eos="<|eot_id|>"),
    "qwen2": Family("Qwen2Config", "Qwen2ForCausalLM", "Qwen-Qwen2.5-7B-Instruct", pre="qwen2",
                    tokenizer_class="Qwen2Tokenizer"),
    "qwen3": Family("Qwen3Config", "Qwen3ForCausalLM", "Qwen-Qwen3-0.6B", pre="qwen2",
                    tokenizer_class="Qwen2Tokenizer"),
    # norm_topk_prob: as Qwen3-30B-A3B's config says (the class's default is false; llama.cpp always renormalizes)
    "qwen3_moe": Family("Qwen3MoeConfig", "Qwen3MoeForCausalLM", "Qwen-Qwen3-0.6B", pre="qwen2",
                        tokenizer_class="Qwen2Tokenizer", sizes=dict(EXPERTS, norm_topk_prob=True)),
    "qwen2_moe": Family("Qwen2MoeConfig", "Qwen2MoeForCausalLM", "Qwen-Qwen2.5-7B-Instruct", pre="qwen2",
                        tokenizer_class="Qwen2Tokenizer",
                        sizes=dict(EXPERTS, shared_expert_intermediate_size=48)),
    "qwen3_next": Family("Qwen3NextConfig", "Qwen3NextForCausalLM", "Qwen-Qwen3-0.6B", pre="qwen2",
                         tokenizer_class="Qwen2Tokenizer",
                         sizes=dict(QWEN35, **EXPERTS, shared_expert_intermediate_size=48), flags=("--no-mtp",)),
    "qwen3_5": Family("Qwen3_5TextConfig", "Qwen3_5ForCausalLM", "Qwen3.5-4B", pre="qwen35",
                      tokenizer_class="Qwen2Tokenizer", sizes=dict(QWEN35, rope_parameters=QWEN35_ROPE),
                      flags=("--no-mtp",)),
    "qwen3_5_moe": Family("Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM", "Qwen3.5-4B", pre="qwen35",
                          tokenizer_class="Qwen2Tokenizer",
                          sizes=dict(QWEN35, **EXPERTS, shared_expert_intermediate_size=48,
                                     rope_parameters=QWEN35_ROPE), flags=("--no-mtp",)),
    "gpt_oss": Family("GptOssConfig", "GptOssForCausalLM", "openai-gpt-oss-120b", pre="gpt-4o",
                      specials=GPT_OSS_SPECIALS, eos="<|return|>",
                      sizes=dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=32)),
    "glm4_moe": Family("Glm4MoeConfig", "Glm4MoeForCausalLM", "GLM-4.6", pre="glm4",
                       specials=("<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>",
                                 "<|user|>", "<|assistant|>", "<|observation|>"), eos="<|user|>",
                       sizes=dict(num_hidden_layers=2, first_k_dense_replace=1, n_routed_experts=4,
                                  num_experts_per_tok=2, moe_intermediate_size=32, n_group=1, topk_group=1)),
    "smollm3": Family("SmolLM3Config", "SmolLM3ForCausalLM", "HuggingFaceTB-SmolLM3-3B", pre="llama-bpe",
                      sizes=dict(num_hidden_layers=4)),  # its default pattern: every 4th layer without rotary
    "phi3": Family("Phi3Config", "Phi3ForCausalLM", "microsoft-Phi-3.5-mini-instruct", tokenizer="spm",
                   tokenizer_class="LlamaTokenizer", specials=PHI3_SPECIALS, bos="<s>", eos="<|end|>",
                   rstrip=("</s>", *PHI3_SPECIALS[1:])),
    "mistral": Family("MistralConfig", "MistralForCausalLM", "mistralai-Mistral-Nemo-Instruct-2407", pre="tekken",
                      specials=("<unk>", "<s>", "</s>", "[INST]", "[/INST]"), bos="<s>", eos="</s>",
                      ),
    # query_pre_attn_scalar: the head size, as Gemma 2 2B/9B and Gemma 3 1B-12B publish it
    "gemma2": Family("Gemma2Config", "Gemma2ForCausalLM", "google-gemma-2-2b-it", tokenizer="gemma-spm",
                     tokenizer_class="GemmaTokenizer", specials=GEMMA_TURNS, bos="<bos>", eos="<end_of_turn>",
                     sizes=dict(num_hidden_layers=4, sliding_window=8, query_pre_attn_scalar=16)),
    "gemma3": Family("Gemma3TextConfig", "Gemma3ForCausalLM", "google-gemma-2-2b-it", tokenizer="gemma-spm",
                     tokenizer_class="GemmaTokenizer", specials=GEMMA_TURNS, bos="<bos>", eos="<end_of_turn>",
                     sizes=dict(num_hidden_layers=6, sliding_window=8, query_pre_attn_scalar=16)),
    "gemma3n": Family("Gemma3nTextConfig", "Gemma3nForCausalLM", "google-gemma-2-2b-it", tokenizer="gemma-spm",
                      tokenizer_class="GemmaTokenizer", specials=GEMMA_TURNS, bos="<bos>", eos="<end_of_turn>",
                      # as Gemma 3n E2B: 20 layers with their own KV (llama.cpp fixes that count), 4 local
                      # to 1 global, the first 10 with activation sparsity; then 2 layers sharing KV
                      sizes=dict(num_hidden_layers=22, layer_types=GEMMA3N_LAYERS, sliding_window=8,
                                 num_kv_shared_layers=2, vocab_size_per_layer_input=VOCAB,
                                 hidden_size_per_layer_input=256, laurel_rank=64,
                                 activation_sparsity_pattern=[0.95] * 10 + [0.0] * 12, intermediate_size=[128] * 22)),
    "gemma4": Family("Gemma4TextConfig", "Gemma4ForCausalLM", "google-gemma-4-31B-it", tokenizer="gemma4",
                     tokenizer_class="GemmaTokenizer", specials=(), bos="<bos>", eos="<eos>",
                     # the layers sharing their KV come after a sliding and a full one, as in Gemma 4's
                     # (llama.cpp's loader takes the last two unshared layers as the ones shared)
                     sizes=dict(num_hidden_layers=6, layer_types=["sliding_attention", "full_attention"] * 3,
                                sliding_window=4, global_head_dim=32, num_global_key_value_heads=1,
                                num_kv_shared_layers=2, hidden_size_per_layer_input=8,
                                vocab_size_per_layer_input=VOCAB)),
    "mamba2": Family("Mamba2Config", "Mamba2ForCausalLM", None, pre="gpt-2", tokenizer_class="GPTNeoXTokenizer",
                     specials=("<|endoftext|>",), eos="<|endoftext|>",
                     sizes=dict(num_hidden_layers=2, num_heads=8, head_dim=16, state_size=16, n_groups=1,
                                chunk_size=8, expand=2)),
    "falcon_h1": Family("FalconH1Config", "FalconH1ForCausalLM", "Qwen-Qwen2.5-7B-Instruct", pre="falcon-h1",
                        sizes=dict(mamba_d_ssm=128, mamba_n_heads=8, mamba_d_head=16, mamba_d_state=16,
                                   mamba_n_groups=1, mamba_chunk_size=8)),
    "jamba": Family("JambaConfig", "JambaForCausalLM", None, tokenizer="spm", tokenizer_class="LlamaTokenizer",
                    specials=("<|im_start|>", "<|im_end|>"), bos="<s>", eos="<|im_end|>",
                    sizes=dict(num_hidden_layers=4, attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2,
                               expert_layer_offset=0, num_experts=4, num_experts_per_tok=2, mamba_d_state=8)),
    "lfm2_moe": Family("Lfm2MoeConfig", "Lfm2MoeForCausalLM", "LFM2-8B-A1B", pre="lfm2",
                       specials=("<|startoftext|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"),
                       bos="<|startoftext|>",
                       sizes=dict(num_hidden_layers=4, layer_types=["conv", "full_attention"] * 2, num_dense_layers=1,
                                  num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)),
    "nemotron_h": Family("NemotronHConfig", "NemotronHForCausalLM", "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16",
                         pre="llama-bpe",
                         # Nemotron 3's kinds of layer (Mamba, experts, attention: its pattern has no dense MLP)
                         sizes=dict(layers_block_type=["mamba", "moe", "attention", "moe"], mamba_num_heads=8,
                                    mamba_head_dim=16, ssm_state_size=16, n_groups=1, chunk_size=8,
                                    n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                    moe_shared_expert_intermediate_size=48)),
    "lfm2": Family("Lfm2Config", "Lfm2ForCausalLM", "LFM2.5-Instruct", pre="lfm2",
                   specials=("<|startoftext|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"),
                   bos="<|startoftext|>", sizes=dict(num_hidden_layers=4, full_attn_idxs=[1, 3])),
    "granitemoehybrid": Family("GraniteMoeHybridConfig", "GraniteMoeHybridForCausalLM", "ibm-granite-granite-4.0",
                               pre="refact", tokenizer_class="GPT2Tokenizer",
                               specials=("<|end_of_text|>", "<|start_of_role|>", "<|end_of_role|>"),
                               eos="<|end_of_text|>",
                               sizes=dict(num_hidden_layers=4, layer_types=["mamba", "mamba", "attention", "mamba"],
                                          mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=1, mamba_chunk_size=8,
                                          num_local_experts=4, num_experts_per_tok=2, shared_intermediate_size=64)),
}  # fmt: skip


def hub_spelling(folder: Path, dst: Path, name: str) -> Path:
    """The folder as the hub publishes the family's config, where transformers 5 writes
    it in a way the pinned converter cannot read: Granite 4.0's layer kinds as
    ``mamba`` / ``attention`` (transformers 5 saves ``linear_attention`` /
    ``full_attention``, which the converter does not know: it would write every layer as
    Mamba), Falcon-H1's ``head_dim`` (transformers 5's class no longer writes it; the
    converter requires it), Gemma 3n's key and value projections in the layers that share
    another's KV (the published files carry them, unused; transformers 5 builds none, and
    llama.cpp's loader requires them: they are copied from the last layer with its own).
    ``folder`` itself for every other family."""
    cfg = json.loads((folder / "config.json").read_text())
    if name == "gemma3n":
        from safetensors.torch import load_file, save_file

        shutil.copytree(folder, dst)
        weights = load_file(dst / "model.safetensors")
        own = cfg["num_hidden_layers"] - cfg["num_kv_shared_layers"]
        for i in range(own, cfg["num_hidden_layers"]):
            for part in ("k_proj.weight", "v_proj.weight", "k_norm.weight"):
                weights[f"model.layers.{i}.self_attn.{part}"] = weights[
                    f"model.layers.{own - 1}.self_attn.{part}"].clone()  # fmt: skip
        save_file(weights, dst / "model.safetensors", metadata={"format": "pt"})
        return dst
    if name == "granitemoehybrid":
        cfg["layer_types"] = ["attention" if t == "full_attention" else "mamba" for t in cfg["layer_types"]]
    elif name == "falcon_h1":
        cfg["head_dim"] = cfg["hidden_size"] // cfg["num_attention_heads"]
    else:
        return folder
    shutil.copytree(folder, dst)
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    return dst


def templates_dir() -> Path:
    from gguf_tools import TEMPLATES, converter_tree

    return converter_tree() / TEMPLATES


def _config(fam: Family, ids: dict[str, int]):
    import transformers

    cls = getattr(transformers, fam.config)
    known = inspect.signature(cls.__init__).parameters
    args = {k: v for k, v in {**SIZES, **fam.sizes}.items() if k in known}
    for key, token in (("bos_token_id", fam.bos), ("eos_token_id", fam.eos), ("pad_token_id", fam.eos)):
        if key in known and token is not None:
            args[key] = ids[token]
    return cls(**args)


def _mark_special(folder: Path, specials: tuple[str, ...], rstrip: tuple[str, ...]) -> None:
    """The family's chat markers as special tokens in tokenizer.json (``rstrip``: those
    that swallow the whitespace after them, as Phi-3's), and tokenizer_config.json's
    ``added_tokens_decoder`` as the hub's files carry it (transformers 4 wrote it; the
    converter reads the special ones from it as control tokens)."""
    spec = json.loads((folder / "tokenizer.json").read_text())
    decoder = {}
    for added in spec["added_tokens"]:
        added["special"] = added["special"] or added["content"] in specials
        added["rstrip"] = added["content"] in rstrip
        decoder[str(added["id"])] = {k: added[k] for k in ("content", "lstrip", "normalized", "rstrip", "single_word",
                                                           "special")}  # fmt: skip
    (folder / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False))
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg["added_tokens_decoder"] = decoder
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))


def write_tokenizer(folder: Path, fam: Family) -> None:
    """The family's tokenizer (tokenizer.json, tokenizer_config.json naming its class)
    and its chat template (chat_template.jinja) in ``folder``."""
    from checkpoints import write_gemma4_tokenizer, write_spm_tokenizer
    from encoders import write_gemma_spm
    from family_tokenizers import write_family_tokenizer

    folder.mkdir(parents=True, exist_ok=True)
    cfg = {"bos_token": fam.bos, "eos_token": fam.eos, "add_bos_token": fam.bos is not None}
    if fam.tokenizer == "bpe":
        write_family_tokenizer(folder, fam.pre, VOCAB, fam.specials, fam.tokenizer_class, cfg)
    elif fam.tokenizer == "spm":
        own = ("<s>", "</s>", "<unk>", "<|im_start|>", "<|im_end|>")  # the trainer's (tests/checkpoints.py)
        write_spm_tokenizer(folder, VOCAB, symbols=tuple(s for s in fam.specials if s not in own))
    elif fam.tokenizer == "gemma-spm":
        write_gemma_spm(folder, symbols=fam.specials, add_eos=False)
    else:
        write_gemma4_tokenizer(folder, VOCAB)
    _mark_special(folder, fam.specials, fam.rstrip)
    tok_cfg = json.loads((folder / "tokenizer_config.json").read_text())
    tok_cfg.update(tokenizer_class=fam.tokenizer_class, bos_token=fam.bos, eos_token=fam.eos)
    tok_cfg.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
    (folder / "chat_template.jinja").unlink(missing_ok=True)  # the tokenizer writers' own
    if fam.template:
        (folder / "chat_template.jinja").write_text((templates_dir() / f"{fam.template}.jinja").read_text())


def build(folder: Path, name: str, seed: int = 0) -> Path:
    """The folder of family ``name``: tokenizer and chat template first, then the model
    (random weights, every one moved off its init) saved by ``save_pretrained``."""
    import torch
    import transformers
    from checkpoints import jitter
    from tokenizers import Tokenizer as HFTokenizer

    fam = FAMILIES[name]
    write_tokenizer(folder, fam)
    vocab = HFTokenizer.from_file(str(folder / "tokenizer.json"))
    ids = {t: vocab.token_to_id(t) for t in (fam.bos, fam.eos) if t is not None}
    torch.manual_seed(seed)
    model = getattr(transformers, fam.model)(_config(fam, ids))
    jitter(model)
    model.save_pretrained(folder)
    return folder
