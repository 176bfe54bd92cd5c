"""Which of a model's layers keep a GGUF file's weights in blocks, and the swap of those
layers for ``BlockLinear`` / ``BlockEmbedding`` while the model is still on the meta
device, so that no float32 copy of a kept weight is ever made.

A linear layer is kept when every checkpoint tensor it is built from (one, or the
shards of a fused q/k/v or gate/up) is 2-D and of a kept type in the file (an expert's:
its rows of the layer's stacked [experts, out, in]); an embedding likewise. A tied
output head shares its embedding's blocks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

from engine.errors import CheckpointError
from engine.kernels.block_model import block_modules
from engine.kernels.blocks import KEPT, BlockEmbedding, BlockLinear
from engine.loading.gguf.archs import ARCHITECTURES
from engine.loading.gguf.checkpoint import GGUFCheckpoint
from engine.models.base import DecoderLM, checkpoint_name


@dataclass
class BlockPlan:
    """HF tensor name -> (module path, part index) for every tensor read as blocks, and
    the tied heads (head path -> embedding path) to point at their embedding's blocks."""

    parts: dict[str, tuple[str, int]] = field(default_factory=dict)
    tied: dict[str, str] = field(default_factory=dict)

    @property
    def keep(self) -> frozenset[str]:
        return frozenset(self.parts)


def _sources(model: DecoderLM, path: str, names: set[str]) -> list[str]:
    """The checkpoint tensors (in part order) a module's weight is built from."""
    local = path.rsplit(".", 1)[-1]
    shards = model._shards.get(local)
    if shards is None:
        return [f"{path}.weight"] if f"{path}.weight" in names else []
    return [checkpoint_name(f"{path}.weight", s) for s in range(len(shards))]


def plan_blocks(model: DecoderLM, ckpt: GGUFCheckpoint, hf_names: list[str]) -> BlockPlan:
    """Swap, in ``model`` (built on the meta device), the layers whose weights stay in
    blocks; returns what the loader routes to them."""
    plan = BlockPlan()
    if not ARCHITECTURES[ckpt.arch].keeps_blocks:
        return plan
    names, table = set(hf_names), ckpt.name_map()
    modules = dict(model.named_modules())
    embeddings = {id(m.weight): p for p, m in modules.items() if isinstance(m, nn.Embedding)}
    for path, module in modules.items():
        if not isinstance(module, nn.Linear | nn.Embedding):
            continue
        tied_to = embeddings.get(id(module.weight)) if isinstance(module, nn.Linear) else None
        if tied_to is not None:  # the head reads its embedding's table (decided below)
            plan.tied[path] = tied_to
            continue
        sources = _sources(model, path, names)
        stored = [ckpt.stored_type(table, s) for s in sources]
        expert = isinstance(module, nn.Linear) and ".experts." in path  # its rows of a stacked [E, out, in]
        if not sources or any(s is None or s[0] not in KEPT or len(s[1]) != (3 if expert else 2) for s in stored):
            continue
        if isinstance(module, nn.Embedding):
            swap = BlockEmbedding(module.num_embeddings, module.embedding_dim)
        else:
            outs = [s[1][1] if expert else s[1][0] for s in stored]
            swap = BlockLinear(module.in_features, outs, bias=module.bias is not None)
        model.set_submodule(path, swap)
        plan.parts.update({s: (path, i) for i, s in enumerate(sources)})
    kept_paths = {p for p, _ in plan.parts.values()}
    plan.tied = {head: emb for head, emb in plan.tied.items() if emb in kept_paths}
    for head, emb in plan.tied.items():
        embedding = model.get_submodule(emb)
        model.set_submodule(head, BlockLinear(embedding.embedding_dim, [embedding.num_embeddings]))
    return plan


def route_blocks(model: nn.Module, plan: BlockPlan, tensors):
    """Pass ``tensors`` (file, name, tensor) through, handing those read as blocks to
    their layers instead. Raises CheckpointError on a shape mismatch."""
    for file, name, tensor in tensors:
        target = plan.parts.get(name)
        if target is None:
            yield file, name, tensor
            continue
        try:
            model.get_submodule(target[0]).set_part(target[1], tensor)
        except (ValueError, AttributeError) as exc:
            raise CheckpointError(f"{file}: tensor '{name}': {exc}") from exc


def finish_blocks(model: nn.Module, plan: BlockPlan) -> None:
    """Point tied heads at their embedding's blocks; CheckpointError if a part is missing."""
    for head, emb in plan.tied.items():
        model.get_submodule(head).set_part(0, model.get_submodule(emb).table)
    missing = [f"{type(m).__name__} part {i}" for m in block_modules(model) for i in m.missing]
    if missing:
        raise CheckpointError(f"checkpoint is missing tensors: {', '.join(missing[:8])}")
