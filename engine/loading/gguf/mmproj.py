"""A multimodal projector file (llama.cpp's ``--mmproj``: what ``convert_hf_to_gguf.py
--mmproj`` writes): the vision encoder and projector of a vision-language model whose
language model is another GGUF. Read here for Gemma 3 (``clip.projector_type``
``gemma3``), SmolVLM / Idefics3 (``idefics3``), both SigLIP, and Qwen2.5-VL
(``qwen2.5vl_merger``): its ``clip.vision.*`` fields become the MediaConfig a Hugging
Face folder's ``vision_config`` gives, and its ``v.*`` / ``mm.*`` tensors the encoder's
and projector's weights under engine/models/gemma3_vision.py's, smolvlm.py's and
qwen2_5_vl.py's names (Qwen's q/k/v put back together, its 3-D patch embedding from the
two 2-D halves the converter split it into). Qwen3.5's tower (``qwen3vl_merger``, the
projector type the converter gives Qwen3-VL's too) is read without Qwen3-VL's deepstack
taps: a file with them is refused.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path

import torch

from engine.errors import CheckpointError
from engine.loading.gguf.checkpoint import GGUFCheckpoint
from engine.loading.gguf.header import read_header
from engine.loading.gguf.shards import OpenShards
from engine.models.config import MediaConfig

QWEN = "qwen2.5vl_merger"
QWEN3 = "qwen3vl_merger"
PROJECTORS = ("gemma3", "idefics3", QWEN, QWEN3)
ENCODER = {"gemma3": "vision_tower.", "idefics3": "vision_model.", QWEN: "visual.", QWEN3: "visual."}  # ours
_LAYER = {  # ours (under vision_tower.encoder.layers.N.) -> the file's (under v.blk.N.)
    "layer_norm1": "ln1",
    "layer_norm2": "ln2",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.out_proj": "attn_out",
    "mlp.fc1": "ffn_up",
    "mlp.fc2": "ffn_down",
    "norm1": "ln1",  # Qwen's block
    "norm2": "ln2",
    "attn.proj": "attn_out",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "mlp.linear_fc1": "ffn_up",  # Qwen3.5's
    "mlp.linear_fc2": "ffn_down",
}
_FIXED = {  # ours (under the encoder's prefix, or whole) -> the file's
    "embeddings.patch_embedding": "v.patch_embd",
    "embeddings.position_embedding": "v.position_embd",
    "post_layernorm": "v.post_ln",
    "multi_modal_projector.mm_soft_emb_norm": "mm.soft_emb_norm",
    "connector.modality_projection.proj": "mm.model.fc",
    "merger.ln_q": "v.post_ln",
    "merger.mlp.0": "mm.0",
    "merger.mlp.2": "mm.2",
    "patch_embed.proj": "v.patch_embd",  # Qwen3.5's (the weight from two halves: _qwen_tensor)
    "pos_embed": "v.position_embd",
    "merger.norm": "v.post_ln",
    "merger.linear_fc1": "mm.0",
    "merger.linear_fc2": "mm.2",
}
PROJECTION = "multi_modal_projector.mm_input_projection_weight"


def file_name(ours: str, kind: str = "gemma3") -> str:
    """The mmproj tensor a parameter of engine/models/gemma3_vision.py or smolvlm.py comes
    from (``kind``: the projector type)."""
    if ours == PROJECTION:
        return "mm.input_projection.weight"
    stem, _, part = ours.rpartition(".")
    stem = stem.removeprefix(ENCODER[kind])
    if stem in _FIXED:
        return f"{_FIXED[stem]}.{part}"
    m = re.fullmatch(r"(?:encoder\.layers|blocks)\.(\d+)\.(.+)", stem)
    if m is None or m.group(2) not in _LAYER:
        raise CheckpointError(f"no mmproj tensor for '{ours}'")
    return f"v.blk.{m.group(1)}.{_LAYER[m.group(2)]}.{part}"


class MmprojFile(GGUFCheckpoint):
    """Raises CheckpointError for a file that is no readable GGUF projector of a kind
    slotserve serves."""

    def __init__(self, path: Path):
        self.path, self.mmap = Path(path), False
        self.shards = [self.path]
        try:
            header = read_header(self.path)
        except (ValueError, OSError) as exc:
            raise CheckpointError(f"{path}: not a readable GGUF file: {exc}") from exc
        self.fields, self.tensors = header.fields, header.tensors
        kind = self.get("clip.projector_type")
        if not self.get("clip.has_vision_encoder") or kind not in PROJECTORS:
            raise CheckpointError(
                f"{path}: a projector of type '{kind}' is not served (supported: {', '.join(PROJECTORS)} vision)"
            )

    def media_config(self, token_id) -> MediaConfig:
        """The MediaConfig of this projector; ``token_id(text)`` looks a token up in the
        language model's vocabulary (Gemma 3's image markers; the placeholder id is only
        matched, never embedded, so a vocabulary without it takes 0)."""
        g = lambda key, default=None: self.get(f"clip.vision.{key}", default)  # noqa: E731
        if self.kind == QWEN:
            return self._qwen_config(g, token_id)
        if self.kind == QWEN3:
            return self._qwen3_config(g, token_id)
        side = int(g("image_size")) // int(g("patch_size"))
        smol = self.kind == "idefics3"
        scale = int(g("projector.scale_factor", 2 if smol else 4))
        vision = {
            "hidden_size": g("embedding_length"),
            "intermediate_size": g("feed_forward_length"),
            "num_hidden_layers": g("block_count"),
            "num_attention_heads": g("attention.head_count"),
            "image_size": g("image_size"),
            "patch_size": g("patch_size"),
            "layer_norm_eps": g("attention.layer_norm_epsilon", 1e-6),
            "image_mean": list(g("image_mean", [0.5, 0.5, 0.5])),
            "image_std": list(g("image_std", [0.5, 0.5, 0.5])),
        }
        if smol:  # SmolVLM: the pixel shuffle folds the grid by ``scale``
            vision |= {"scale_factor": scale, "preproc_image_size": g("preproc_image_size", 4 * g("image_size"))}
            image, boi, eoi = token_id("<image>"), None, None
        else:  # Gemma 3: the grid average-pooled by ``scale``
            image, boi, eoi = token_id("<image_soft_token>"), token_id("<start_of_image>"), token_id("<end_of_image>")
        return MediaConfig(
            vision=vision,
            image_token_id=image if image is not None else 0,
            boi_token_id=boi,
            eoi_token_id=eoi,
            tokens_per_image=(side // scale) ** 2,
        )

    @staticmethod
    def _qwen_config(g, token_id) -> MediaConfig:
        """Qwen2.5-VL's: the windowed blocks' pattern as llama.cpp keeps it (every
        ``n_wa_pattern``-th block sees the whole image), windows of 112 pixels unless the
        file says otherwise (llama.cpp's default); a token count that follows the image."""
        depth, every = int(g("block_count")), int(g("n_wa_pattern", 8))
        vision = {
            "depth": depth,
            "hidden_size": g("embedding_length"),
            "intermediate_size": g("feed_forward_length"),
            "num_heads": g("attention.head_count"),
            "out_hidden_size": g("projection_dim"),
            "patch_size": g("patch_size", 14),
            "window_size": g("window_size", 112),
            "fullatt_block_indexes": [i for i in range(depth) if (i + 1) % every == 0],
            "image_mean": list(g("image_mean")),
            "image_std": list(g("image_std")),
        }
        image = token_id("<|image_pad|>")
        return MediaConfig(
            vision=vision,
            image_token_id=image if image is not None else 0,
            boi_token_id=token_id("<|vision_start|>"),
            eoi_token_id=token_id("<|vision_end|>"),
            tokens_per_image=0,
        )

    def _qwen3_config(self, g, token_id) -> MediaConfig:
        """Qwen3.5's: the learned position table's side from ``image_size`` / ``patch_size``
        (how the converter wrote it); a token count that follows the image."""
        if any(g("is_deepstack_layers", [])):
            raise CheckpointError(f"{self.path}: a projector with Qwen3-VL's deepstack layers is not served")
        patch = int(g("patch_size", 16))
        vision = {
            "depth": g("block_count"),
            "hidden_size": g("embedding_length"),
            "intermediate_size": g("feed_forward_length"),
            "num_heads": g("attention.head_count"),
            "out_hidden_size": g("projection_dim"),
            "patch_size": patch,
            "spatial_merge_size": g("spatial_merge_size", 2),
            "num_position_embeddings": (int(g("image_size")) // patch) ** 2,
            "image_mean": list(g("image_mean")),
            "image_std": list(g("image_std")),
        }
        return dataclasses.replace(self._qwen_config(g, token_id), vision=vision)

    @property
    def kind(self) -> str:
        return self.get("clip.projector_type")

    def _qwen_tensor(self, ours: str, files: OpenShards) -> torch.Tensor | None:
        """Qwen's fused q/k/v (the file keeps three) and 3-D patch embedding (two 2-D
        halves, one per frame in time); None for any other tensor."""
        m = re.fullmatch(r"visual\.blocks\.(\d+)\.attn\.qkv\.(weight|bias)", ours)
        if m is not None and f"v.blk.{m.group(1)}.attn_qkv.{m.group(2)}" in self.tensors:  # Qwen3.5's: kept fused
            return self.tensor(f"v.blk.{m.group(1)}.attn_qkv.{m.group(2)}", files)
        if m is not None:
            return torch.cat([self.tensor(f"v.blk.{m.group(1)}.attn_{x}.{m.group(2)}", files) for x in "qkv"])
        if ours == "visual.patch_embed.proj.weight":
            halves = [self.tensor(name, files) for name in ("v.patch_embd.weight", "v.patch_embd.weight.1")]
            return torch.stack(halves, 2)
        return None

    def iter_weights(self, names: list[str], shapes: dict[str, torch.Size]) -> Iterator[tuple[str, str, torch.Tensor]]:
        """(file, our name, tensor) for each of ``names``, in the parameter's shape
        (``shapes``; the projection matrix may be stored the other way round). The
        projector's Gemma RMSNorm weight is stored with the 1 its norm adds (the
        converter's): taken off again."""
        files = OpenShards(self.shards)
        try:
            for ours in names:
                tensor = self._qwen_tensor(ours, files) if self.kind in (QWEN, QWEN3) else None
                if tensor is None:
                    found = file_name(ours, self.kind)
                    if found not in self.tensors:
                        raise CheckpointError(f"{self.path}: no tensor '{found}' (for '{ours}')")
                    tensor = self.tensor(found, files)
                if ours.endswith("mm_soft_emb_norm.weight"):
                    tensor = tensor.float() - 1.0
                want = shapes[ours]
                if tuple(tensor.shape) != want and tuple(tensor.shape[::-1]) == want and tensor.dim() == 2:
                    tensor = tensor.T
                yield self.path.name, ours, tensor.reshape(want) if tensor.numel() == want.numel() else tensor
        finally:
            files.close()
