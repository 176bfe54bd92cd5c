"""The decoder-only LM all Llama-family architectures share.

Subclasses set class data only: whether q/k/v carry a bias, whether q and k are
RMS-normalized per head. Module names follow the Hugging Face checkpoint names except
for the fused projections, which ``FUSED`` maps (checkpoint name -> fused param, shard).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import torch
from torch import nn

from engine.errors import CheckpointError
from engine.models.config import ModelConfig
from engine.models.layers import AttentionShape, DecoderLayer, RMSNorm, embedding
from engine.models.rope import Rotary, rotate
from memory import ForwardView, FullAttentionSpec, LayerSpec, SlidingWindowSpec

log = logging.getLogger("slotserve")

FUSED = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
_UNFUSED = {v: k for k, v in FUSED.items()}


def checkpoint_name(param: str, shard: int | None) -> str:
    if shard is None:
        return param
    parts = param.split(".")
    return ".".join(parts[:-2] + [_UNFUSED[(parts[-2], shard)], parts[-1]])


def rotary_dims(cfg: ModelConfig) -> int:
    """The rotated part of each head: ``partial_rotary_factor`` of it (rotate-half over
    those dims: Phi-4-mini, GLM-4 MoE), the whole head by default; Gemma 4's
    "proportional" rope turns part of the angles of the whole head instead."""
    if cfg.rope.rope_type == "proportional":
        return cfg.head_dim
    return int(cfg.head_dim * cfg.rope.partial_rotary_factor) // 2 * 2


class DecoderLM(nn.Module):
    qkv_bias: bool | None = None  # None: config's attention_bias
    qk_norm: bool = False
    o_bias: bool | None = None  # None: the output projection's bias follows q/k/v's (the config's)
    media_bidirectional = False  # an image's tokens see each other both ways (Gemma 3), else causal
    media_prefixes: tuple[str, ...] = ()  # the image encoder's parameters (what a --mmproj file holds; never fused)
    checkpoint_prefixes: tuple[tuple[str, str], ...] = ()  # a checkpoint's name prefix -> ours, first match
    skipped_prefixes: tuple[str, ...] = ()  # (ours) checkpoint tensors this model does not use

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        if set(cfg.layer_types) - {"full_attention", "sliding_attention"}:  # given a hybrid's layer list
            given = [t for t in cfg.raw.get("layer_types") or [] if "attention" not in str(t)]
            raise CheckpointError(
                f"config.json: field 'layer_types' names {', '.join(map(str, given))}, "
                f"which {cfg.architecture} does not have (attention layers only)"
            )
        qkv_bias = cfg.attention_bias if self.qkv_bias is None else self.qkv_bias
        shape = AttentionShape(
            hidden=cfg.hidden_size,
            n_heads=cfg.n_heads,
            n_kv_heads=cfg.n_kv_heads,
            head_dim=cfg.head_dim,
            qkv_bias=qkv_bias,
            o_bias=cfg.attention_bias and self.qkv_bias is None if self.o_bias is None else self.o_bias,
            qk_norm=self.qk_norm,
            eps=cfg.rms_norm_eps,
            rotary_dim=rotary_dims(cfg),
        )
        self.model = nn.Module()
        self.model.embed_tokens = embedding(cfg.vocab_size, cfg.hidden_size)
        self.model.layers = nn.ModuleList(
            DecoderLayer(shape, cfg.intermediate_size, cfg.mlp_bias, i) for i in range(cfg.n_layers)
        )
        self.model.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.rotary = Rotary(cfg.rope, rotary_dims(cfg), cfg.max_position_embeddings)
        self._shards = {
            "qkv_proj": [shape.n_heads * shape.head_dim] + [shape.n_kv_heads * shape.head_dim] * 2,
            "gate_up_proj": [cfg.intermediate_size] * 2,
        }

    def tie_weights(self) -> None:
        """Point the LM head at the input embeddings when the config ties them (after
        ``materialize``; a head kept in blocks shares them already)."""
        if self.cfg.tie_word_embeddings and isinstance(self.lm_head, nn.Linear):
            self.lm_head.weight = self.model.embed_tokens.weight

    def init_buffers(self, device: torch.device) -> None:
        """(Re)compute the buffers that are not in the checkpoint (rotary frequencies)."""
        self.rotary = Rotary(self.cfg.rope, rotary_dims(self.cfg), self.cfg.max_position_embeddings).to(device)

    # ---- memory ----------------------------------------------------------------

    def layer_specs(self, dtype: torch.dtype) -> list[LayerSpec]:
        """Per-layer memory spec (index = layer), from the config's layer types."""
        cfg = self.cfg
        return [
            SlidingWindowSpec(cfg.n_kv_heads, cfg.head_dim, dtype, cfg.sliding_window)
            if kind == "sliding_attention"
            else FullAttentionSpec(cfg.n_kv_heads, cfg.head_dim, dtype)
            for kind in cfg.layer_types
        ]

    def rope_shift(self, layer: int, k: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        """Re-rotate stored keys k: [N, KVH, D] by ``delta`` ([N]) positions."""
        cos, sin = self.rotary.cos_sin(delta, scaled=False)
        r = rotary_dims(self.cfg)
        if r < k.shape[-1]:  # the rotated part only
            return torch.cat([rotate(k[..., :r].float().contiguous(), cos, sin).to(k.dtype), k[..., r:]], dim=-1)
        return rotate(k.float(), cos, sin).to(k.dtype)

    # ---- forward ---------------------------------------------------------------

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, view: ForwardView, logit_rows: torch.Tensor
    ) -> torch.Tensor:
        """input_ids, positions: [T]; logit_rows: [S] rows to project -> logits [S, vocab] float32."""
        return self.project(self.hidden(input_ids, positions, view, logit_rows))

    def hidden(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        view: ForwardView,
        rows: torch.Tensor,
        media=None,
        rope_long: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """input_ids, positions: [T]; rows: [S] -> the final hidden states of those rows
        [S, hidden], after the final norm (transformers' ``last_hidden_state``). ``media``:
        (rows [M], image tokens [M, hidden]) that replace those rows' embeddings.
        ``rope_long`` [T] bool (LongRoPE): the rows turned by the long factors."""
        x = self.model.embed_tokens(input_ids)  # [T, hidden]
        if media is not None:
            x = x.index_copy(0, media[0], media[1].to(x.dtype))
        cos, sin = self.rotary.cos_sin(positions, long=rope_long)  # [T, 1, D]
        for layer, rope in zip(self.model.layers, self.layer_ropes(cos, sin)):
            x = layer(x, *rope, view)
        return self.model.norm(x[rows])  # [S, hidden]

    def layer_ropes(self, cos: torch.Tensor, sin: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each layer's rotation (the same for all; SmolLM3's position-free layers none)."""
        return [(cos, sin)] * len(self.model.layers)

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """Final hidden states [S, hidden] -> logits [S, vocab] float32."""
        return self.lm_head(x).float()

    # ---- weights ---------------------------------------------------------------

    def _target(self, name: str) -> tuple[str, int | None]:
        if self.media_prefixes and name.startswith(self.media_prefixes):  # the encoder's q/k/v stay separate
            return name, None
        parts = name.split(".")
        if len(parts) >= 2 and parts[-2] in FUSED:
            fused, shard = FUSED[parts[-2]]
            return ".".join(parts[:-2] + [fused, parts[-1]]), shard
        return name, None

    def _renamed(self, tensors: Iterable[tuple[str, str, torch.Tensor]]) -> Iterable[tuple[str, str, torch.Tensor]]:
        """The triples under our names (``checkpoint_prefixes``), less ``skipped_prefixes``."""
        for file, name, tensor in tensors:
            for theirs, ours in self.checkpoint_prefixes:
                if name.startswith(theirs):
                    name = ours + name[len(theirs) :]
                    break
            if not (self.skipped_prefixes and name.startswith(self.skipped_prefixes)):
                yield file, name, tensor

    def load_weights(self, tensors: Iterable[tuple[str, str, torch.Tensor]]) -> None:
        """Copy (file, name, tensor) triples into the modules; every parameter must be filled.

        Raises CheckpointError naming the file and tensor on a shape mismatch, and the
        missing tensor names when the checkpoint is incomplete.
        """
        params = dict(self.named_parameters(remove_duplicate=False))
        filled: set[tuple[str, int | None]] = set()
        bare = False  # tensors saved from the bare model (``Qwen3Model``: no ``model.`` prefix, no head)
        for file, name, tensor in self._renamed(tensors):
            if name.endswith(IGNORED_SUFFIXES) or (name == "lm_head.weight" and self.cfg.tie_word_embeddings):
                continue
            target, shard = self._target(name)
            param = params.get(target)
            if param is None and f"model.{target}" in params:
                target, param, bare = f"model.{target}", params[f"model.{target}"], True
            if param is None:
                raise CheckpointError(f"{file}: unexpected tensor '{name}' for {self.cfg.architecture}")
            dst = param.data
            if shard is not None:
                sizes = self._shards[target.split(".")[-2]]
                if None in sizes:  # equal parts (a gate/up whose width differs by layer: experts, shared)
                    sizes = [dst.shape[0] // len(sizes)] * len(sizes)
                dst = dst.narrow(0, sum(sizes[:shard]), sizes[shard])
            if tuple(dst.shape) != tuple(tensor.shape):
                raise CheckpointError(
                    f"{file}: tensor '{name}' has shape {tuple(tensor.shape)}, expected {tuple(dst.shape)}"
                )
            dst.copy_(tensor)
            fused = target.split(".")[-2] if "." in target else ""
            if shard is None and fused in self._shards:  # the fused tensor as a checkpoint writes it (Phi-3)
                filled.update((target, s) for s in range(len(self._shards[fused])))
            filled.add((target, shard))
        if bare and "lm_head.weight" in params and ("lm_head.weight", None) not in filled:
            self._head_from_embeddings()
            filled.add(("lm_head.weight", None))
        self._check_filled(params, filled)

    def _head_from_embeddings(self) -> None:
        """A bare model's checkpoint has no LM head (an embedding model published as
        ``Qwen3Model`` tensors): the input embeddings stand in for it, as llama.cpp does
        when a file has no output tensor. Embeddings do not use it; generation would."""
        log.warning("%s: the checkpoint has no LM head; the input embeddings stand in for it", self.cfg.architecture)
        self.lm_head.weight = self.model.embed_tokens.weight

    def checkpoint_names(self) -> list[str]:
        """Every tensor name a Hugging Face checkpoint of this model holds (unfused)."""
        names = []
        for name in self._weight_names():
            if name == "lm_head.weight" and self.cfg.tie_word_embeddings:
                continue
            fused = name.split(".")[-2] if "." in name else ""
            shards = range(len(self._shards[fused])) if fused in self._shards else [None]
            names += [checkpoint_name(name, s) for s in shards]
        return list(dict.fromkeys(names))

    def _weight_names(self) -> list[str]:
        """Every weight's name: the parameters', and those of layers kept in blocks
        (engine/kernels/blocks.py: no parameter, filled through ``set_part``)."""
        params = [name for name, _ in self.named_parameters(remove_duplicate=False)]
        return params + [f"{path}.weight" for path, m in self.named_modules() if hasattr(m, "set_part")]

    def _check_filled(self, params: dict[str, nn.Parameter], filled: set[tuple[str, int | None]]) -> None:
        missing = []
        for name in params:
            if name == "lm_head.weight" and self.cfg.tie_word_embeddings:
                continue
            fused = name.split(".")[-2] if "." in name else ""
            shards = range(len(self._shards[fused])) if fused in self._shards else [None]
            missing += [checkpoint_name(name, s) for s in shards if (name, s) not in filled]
        if missing:
            raise CheckpointError(f"checkpoint is missing tensors: {', '.join(sorted(set(missing))[:8])}")
