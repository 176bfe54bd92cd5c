"""What every encoder model (engine/models/bert.py, nomic_bert.py) shares: loading a
checkpoint's tensors by their Hugging Face names into its parameters, or into block
layers (engine/kernels/blocks.py) for the weights a GGUF file keeps in blocks.

A subclass names its modules as its checkpoints do and says, in ``rename``, which of a
checkpoint's names it reads under which of its own (None: a tensor it does not read)."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from engine.errors import CheckpointError
from engine.kernels.blocks import BlockEmbedding, BlockLinear, BlockWeight


class EncoderModel(nn.Module):
    """Contract: ``forward(ids [B, T] right-padded, lengths [B], type_ids [B, T] | None)
    -> last hidden states [B, T, hidden]``; ``pad_id``; ``max_positions`` (the longest
    input); ``head``: a classifier's head over the first token's state, or None;
    ``default_pooling``: how it embeds when its checkpoint names no pooling."""

    default_pooling = "cls"

    def __init__(self) -> None:
        super().__init__()
        self.pad_id = 0
        self.head: nn.Module | None = None  # (a class attribute would hide the registered module)

    @property
    def max_positions(self) -> int:
        raise NotImplementedError

    @property
    def n_labels(self) -> int:
        """A classifier's outputs (0: no head)."""
        return 0 if self.head is None else self.head.out_proj.out_features

    def classify(self, hidden: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """A classifier's logits [B, n_labels] from last hidden states [B, T, hidden] (its
        head over the first token's state; a subclass may pool otherwise)."""
        return self.head(hidden[:, 0])

    def rename(self, name: str) -> str | None:
        """A checkpoint's tensor name -> this model's, or None for one it does not read."""
        return name

    def to_blocks(self, names: Iterable[str]) -> None:
        """Make the layers whose weights ``names`` (checkpoint names) come in GGUF blocks
        block layers: no float copy of those weights is made."""
        for name in names:
            mine = self.rename(name)
            if mine is None or not mine.endswith(".weight"):
                continue
            path = mine.removesuffix(".weight")
            try:
                module = self.get_submodule(path)
            except AttributeError:
                continue  # a tensor load_weights refuses
            if isinstance(module, nn.Linear):
                block = BlockLinear(module.in_features, [module.out_features], bias=module.bias is not None)
            elif isinstance(module, nn.Embedding):
                block = BlockEmbedding(module.num_embeddings, module.embedding_dim)
            else:
                continue
            parent, _, leaf = path.rpartition(".")
            setattr(self.get_submodule(parent) if parent else self, leaf, block)

    def load_weights(self, tensors: Iterable[tuple[str, str, torch.Tensor | BlockWeight]]) -> None:
        """Copy (file, name, tensor) triples in (a ``BlockWeight`` into the block layer
        ``to_blocks`` made); CheckpointError on an unknown or missing tensor or a shape
        mismatch."""
        params = dict(self.named_parameters())
        filled = set()
        for file, given, tensor in tensors:
            name = self.rename(given)
            if name is None:
                continue
            if isinstance(tensor, BlockWeight):
                self._set_block(file, name, tensor)
                continue
            param = params.get(name)
            if param is None:
                raise CheckpointError(f"{file}: unexpected tensor '{given}' for an encoder")
            if tuple(param.shape) != tuple(tensor.shape):
                want, got = tuple(param.shape), tuple(tensor.shape)
                raise CheckpointError(f"{file}: tensor '{given}' has shape {got}, expected {want}")
            param.data.copy_(tensor)
            filled.add(name)
        missing = sorted(set(params) - filled)
        blocks = (BlockLinear, BlockEmbedding)
        missing += [f"{path}.weight" for path, m in self.named_modules() if isinstance(m, blocks) and m.missing]
        if missing:
            raise CheckpointError(f"checkpoint is missing tensors: {', '.join(missing[:8])}")

    def _set_block(self, file: str, name: str, weight: BlockWeight) -> None:
        try:
            module = self.get_submodule(name.removesuffix(".weight"))
        except AttributeError:
            module = None
        if not isinstance(module, BlockLinear | BlockEmbedding) or not name.endswith(".weight"):
            raise CheckpointError(f"{file}: unexpected tensor '{name}' for an encoder")
        try:
            module.set_part(0, weight)
        except ValueError as exc:
            raise CheckpointError(f"{file}: tensor '{name}': {exc}") from None


def rope_table(base: float, head_dim: int, n: int, factor: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [n, head_dim] of positions 0..n-1 (rotate-half layout: each frequency
    twice); ``factor``: linear scaling, the positions divided by it."""
    inv = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)) / factor  # [D/2]
    angles = torch.arange(n, dtype=torch.float32)[:, None] * inv[None, :]  # [n, D/2]
    angles = torch.cat((angles, angles), dim=-1)  # [n, D]
    return angles.cos(), angles.sin()


def rotate_halves(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, H, T, D] rotated by position (halves, not interleaved; transformers' layout)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def window_masks(lengths: torch.Tensor, t: int, radius: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Boolean masks (True: attend) over right-padded inputs of ``lengths`` [B]: every
    real key (a global layer's, [B, 1, 1, T]), and the real keys within ``radius``
    positions of the query either way (a local layer's, [B, 1, T, T]). A byte per entry
    where two float32 [B, 1, T, T] masks took eight: 64 MB, not 512 MB, for one input
    of 8,192 tokens."""
    pos = torch.arange(t)
    keys = (pos[None, :] < lengths[:, None])[:, None, None, :]  # [B, 1, 1, T]
    near = (pos[:, None] - pos[None, :]).abs() <= radius  # [T, T]
    return keys, keys & near[None, None]
