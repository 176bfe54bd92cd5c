"""A multimodal projector file (llama.cpp's ``--mmproj``: what ``convert_hf_to_gguf.py
--mmproj`` writes): the vision encoder and projector of a vision-language model whose
language model is another GGUF. Read here for Gemma 3 (``clip.projector_type``
``gemma3``) and SmolVLM / Idefics3 (``idefics3``), both SigLIP: its ``clip.vision.*``
fields become the MediaConfig a Hugging Face folder's ``vision_config`` gives, and its
``v.*`` / ``mm.*`` tensors the encoder's and projector's weights under
engine/models/gemma3_vision.py's and smolvlm.py's names.
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

PROJECTORS = ("gemma3", "idefics3")
ENCODER = {"gemma3": "vision_tower.", "idefics3": "vision_model."}  # the encoder's prefix in our model
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
_FIXED = {  # ours (under the encoder's prefix, or whole) -> the file's
    "embeddings.patch_embedding": "v.patch_embd",
    "embeddings.position_embedding": "v.position_embd",
    "post_layernorm": "v.post_ln",
    "multi_modal_projector.mm_soft_emb_norm": "mm.soft_emb_norm",
    "connector.modality_projection.proj": "mm.model.fc",
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
    m = re.fullmatch(r"encoder\.layers\.(\d+)\.(.+)", stem)
    if m is None or m.group(2) not in _LAYER:
        raise CheckpointError(f"no mmproj tensor for '{ours}'")
    return f"v.blk.{m.group(1)}.{_LAYER[m.group(2)]}.{part}"


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

    @property
    def kind(self) -> str:
        return self.get("clip.projector_type")

    def iter_weights(self, names: list[str], shapes: dict[str, torch.Size]) -> Iterator[tuple[str, str, torch.Tensor]]:
        """(file, our name, tensor) for each of ``names``, in the parameter's shape
        (``shapes``; the projection matrix may be stored the other way round). The
        projector's Gemma RMSNorm weight is stored with the 1 its norm adds (the
        converter's): taken off again."""
        fd = os.open(self.path, os.O_RDONLY)
        try:
            for ours in names:
                found = file_name(ours, self.kind)
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
