"""A multimodal projector file (llama.cpp's ``--mmproj``: what ``convert_hf_to_gguf.py
--mmproj`` writes): the vision encoder and projector of a vision-language model whose
language model is another GGUF. Read here for Gemma 3 (``clip.projector_type``
``gemma3``): its ``clip.vision.*`` fields become the MediaConfig a Hugging Face folder's
``vision_config`` gives, and its ``v.*`` / ``mm.*`` tensors the encoder's and projector's
weights under engine/models/gemma3_vision.py's names.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import torch

from engine.errors import CheckpointError
from engine.loading.gguf.checkpoint import GGUFCheckpoint
from engine.loading.gguf.header import read_header
from engine.models.config import MediaConfig

PROJECTORS = ("gemma3",)
_LAYER = {  # ours (under vision_tower.encoder.layers.N.) -> the file's (under v.blk.N.)
    "layer_norm1": "ln1",
    "layer_norm2": "ln2",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.out_proj": "attn_out",
    "mlp.fc1": "ffn_up",
    "mlp.fc2": "ffn_down",
}
_FIXED = {
    "vision_tower.embeddings.patch_embedding": "v.patch_embd",
    "vision_tower.embeddings.position_embedding": "v.position_embd",
    "vision_tower.post_layernorm": "v.post_ln",
    "multi_modal_projector.mm_soft_emb_norm": "mm.soft_emb_norm",
}
PROJECTION = "multi_modal_projector.mm_input_projection_weight"


def file_name(ours: str) -> str:
    """The mmproj tensor a parameter of engine/models/gemma3_vision.py comes from."""
    if ours == PROJECTION:
        return "mm.input_projection.weight"
    stem, _, kind = ours.rpartition(".")
    if stem in _FIXED:
        return f"{_FIXED[stem]}.{kind}"
    m = re.fullmatch(r"vision_tower\.encoder\.layers\.(\d+)\.(.+)", stem)
    if m is None or m.group(2) not in _LAYER:
        raise CheckpointError(f"no mmproj tensor for '{ours}'")
    return f"v.blk.{m.group(1)}.{_LAYER[m.group(2)]}.{kind}"


class MmprojFile(GGUFCheckpoint):
    """Raises CheckpointError for a file that is no readable GGUF projector of a kind
    slotserve serves."""

    def __init__(self, path: Path):
        self.path, self.mmap = Path(path), False
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
        side = int(g("image_size")) // int(g("patch_size"))
        per_side = side // int(g("projector.scale_factor", 4))
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
        image = token_id("<image_soft_token>")
        return MediaConfig(
            vision=vision,
            image_token_id=image if image is not None else 0,
            boi_token_id=token_id("<start_of_image>"),
            eoi_token_id=token_id("<end_of_image>"),
            tokens_per_image=per_side * per_side,
        )

    def iter_weights(self, names: list[str], shapes: dict[str, torch.Size]) -> Iterator[tuple[str, str, torch.Tensor]]:
        """(file, our name, tensor) for each of ``names``, in the parameter's shape
        (``shapes``; the projection matrix may be stored the other way round). The
        projector's Gemma RMSNorm weight is stored with the 1 its norm adds (the
        converter's): taken off again."""
        fd = os.open(self.path, os.O_RDONLY)
        try:
            for ours in names:
                found = file_name(ours)
                if found not in self.tensors:
                    raise CheckpointError(f"{self.path}: no tensor '{found}' (for '{ours}')")
                tensor = self.tensor(found, fd)
                if ours.endswith("mm_soft_emb_norm.weight"):
                    tensor = tensor.float() - 1.0
                want = shapes[ours]
                if tuple(tensor.shape) != want and tuple(tensor.shape[::-1]) == want and tensor.dim() == 2:
                    tensor = tensor.T
                yield self.path.name, ours, tensor.reshape(want) if tensor.numel() == want.numel() else tensor
        finally:
            os.close(fd)
