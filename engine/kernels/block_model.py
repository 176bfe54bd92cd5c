"""A model's weights in GGUF blocks as a whole (engine/kernels/blocks.py holds one weight
and its layers): its block layers, their weights by name, their resident bytes by type,
and the repacking of every layer that can be packed at load."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from engine.kernels.blocks import BlockEmbedding, BlockLinear, BlockWeight


def pack_block_linears(model: nn.Module) -> tuple[int, int]:
    """Repack the weights of every ``BlockLinear`` of ``model`` whose parts all have a
    packed layout, except a head tied to an embedding table (the lookups read the file's
    rows; packing would hold the table twice). Returns (layers packed, their bytes)."""
    tables = {id(m.table) for m in model.modules() if isinstance(m, BlockEmbedding) and m.table is not None}
    layers = total = 0
    for module in model.modules():
        if isinstance(module, BlockLinear) and not any(id(p) in tables for p in module.parts):
            packed = module.pack()
            layers, total = layers + (packed > 0), total + packed
    return layers, total


def block_modules(model: nn.Module) -> list[BlockLinear | BlockEmbedding]:
    return [m for m in model.modules() if isinstance(m, BlockLinear | BlockEmbedding)]


def named_block_weights(model: nn.Module) -> Iterator[tuple[str, BlockWeight]]:
    """("<layer path>.part<i>", weight) for every weight of ``model`` kept in blocks (a
    tied head's table comes again under the head's name)."""
    for path, module in model.named_modules():
        if isinstance(module, BlockLinear):
            yield from ((f"{path}.part{i}", p) for i, p in enumerate(module.parts) if p is not None)
        elif isinstance(module, BlockEmbedding) and module.table is not None:
            yield f"{path}.part0", module.table


_DTYPE_NAMES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}


def weight_bytes_by_type(model: nn.Module) -> dict[str, int]:
    """Resident weight bytes of ``model`` by type: GGUF type names for weights in blocks
    ("Q4_K", "Q6_K", ...), "F32"/"F16"/"BF16" for float tensors (parameters and buffers:
    norms, biases, prepacked layers). A tensor shared by two layers counts once."""
    seen: set[int] = set()
    totals: dict[str, int] = {}

    def add(kind: str, tensor: torch.Tensor) -> None:
        key = tensor.data_ptr() if tensor.layout == torch.strided else id(tensor)  # oneDNN-packed: opaque
        if key in seen or tensor.device.type == "meta":
            return
        seen.add(key)
        totals[kind] = totals.get(kind, 0) + tensor.numel() * tensor.element_size()

    for _, weight in named_block_weights(model):
        add(weight.qtype.name, weight.data)
    for tensor in [*model.parameters(), *model.buffers()]:
        add(_DTYPE_NAMES.get(tensor.dtype, str(tensor.dtype).removeprefix("torch.")), tensor)
    return dict(sorted(totals.items()))
