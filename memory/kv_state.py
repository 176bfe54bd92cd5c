"""A sequence's attention cache as plain tensors (``SeqState``), the same for every KV
layout, so a slot saved under one layout restores under another.

``k.<layer>`` / ``v.<layer>``: [n, kv_heads, head_dim] in cell order; ``positions``:
[n]; ``meta["memory_kind"]``: the kind that saved it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from memory.protocol import SeqState, StateMismatch
from memory.spec import LayerSpec

FAR = 2**62  # a position past every real one: padded queries see everything, padded keys nothing
NO_POS = -FAR  # position of a cell no sequence holds, before every real one

KVRopeShift = Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor]
"""rope_shift(layer, k [N, kv_heads, head_dim], delta [N]) -> k rotated by delta."""

KV_KINDS = ("kv_unified", "kv_stream", "kv")  # "kv": files saved before the kinds had their names


def kv_state(kind: str, positions: torch.Tensor, k: dict[int, torch.Tensor], v: dict[int, torch.Tensor]) -> SeqState:
    """Copies of ``k``/``v`` (layer -> [n, KVH, D]) on the CPU, with their positions ([n])."""
    tensors: dict[str, torch.Tensor] = {}
    for layer in k:
        tensors[f"k.{layer}"] = k[layer].to("cpu", memory_format=torch.contiguous_format, copy=True)
        tensors[f"v.{layer}"] = v[layer].to("cpu", memory_format=torch.contiguous_format, copy=True)
    meta = {"memory_kind": kind, "layers": ",".join(str(x) for x in k)}
    return SeqState(positions=positions.to(torch.long, copy=True), tensors=tensors, meta=meta)


def validate_kv_state(
    specs: dict[int, LayerSpec], state: SeqState, into: str, kinds: tuple[str, ...] = KV_KINDS
) -> int:
    """The number of cells of ``state``; raises StateMismatch when it is not a state of
    one of ``kinds`` with exactly the tensors ``specs`` need."""
    n = int(state.positions.numel())
    kind = state.meta.get("memory_kind", "kv")
    if kind not in kinds:
        raise StateMismatch(f"a '{kind}' state does not restore into a '{into}' memory")
    if state.positions.dim() != 1:
        raise StateMismatch("positions must be one-dimensional")
    for layer, spec in specs.items():
        for name in (f"k.{layer}", f"v.{layer}"):
            t = state.tensors.get(name)
            if t is None:
                raise StateMismatch(f"state lacks tensor {name}")
            if tuple(t.shape) != (n, spec.n_kv_heads, spec.head_dim):
                raise StateMismatch(f"{name} has shape {tuple(t.shape)}, want {(n, spec.n_kv_heads, spec.head_dim)}")
    extra = set(state.tensors) - {f"{kv}.{layer}" for layer in specs for kv in "kv"}
    if extra:
        raise StateMismatch(f"state has unknown tensors {sorted(extra)[:4]}")
    return n
