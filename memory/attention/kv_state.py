"""A sequence's attention cache as plain tensors (``SeqState``), the same for every KV
layout, so a slot saved under one layout restores under another.

``k.<layer>`` / ``v.<layer>``: [n, kv_heads, head_dim] in cell order; ``positions``:
[n]; ``meta["memory_kind"]``: the kind that saved it; ``k_type``/``v_type``: the
stored types (llama-server's names); a state restores only where they are the same.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from memory.kv_codec import CODECS, KVCodec
from memory.protocol import SeqState, StateMismatch
from memory.spec import LayerSpec

FAR = 2**62  # a position past every real one: padded queries see everything, padded keys nothing
NO_POS = -FAR  # position of a cell no sequence holds, before every real one

KVRopeShift = Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor]
"""rope_shift(layer, k [N, kv_heads, head_dim], delta [N]) -> k rotated by delta."""

KV_KINDS = ("kv_unified", "kv_stream", "kv")  # "kv": files saved before the kinds had their names
_PLAIN = {c.storage: name for name, c in CODECS.items() if not c.block}


def type_meta(specs: dict[int, LayerSpec]) -> dict[str, str]:
    """``k_type``/``v_type`` of a memory's attention layers (llama-server's names), for a state's metadata."""
    first = next(iter(specs.values()), None)
    return {"k_type": first.k_codec.name, "v_type": first.v_codec.name} if first is not None else {}


def shift_stored(codec: KVCodec, rope_shift: KVRopeShift, layer: int, k: torch.Tensor, delta: torch.Tensor):
    """Stored keys k [N, KVH, stored row] re-rotated by ``delta`` ([N]) positions, stored again."""
    return codec.encode(rope_shift(layer, codec.decode(k), delta))


def kv_state(
    kind: str, positions: torch.Tensor, k: dict[int, torch.Tensor], v: dict[int, torch.Tensor], types: dict[str, str]
) -> SeqState:
    """Copies of ``k``/``v`` (layer -> [n, KVH, stored row]) on the CPU, with their
    positions ([n]); ``types``: ``type_meta`` of the memory."""
    tensors: dict[str, torch.Tensor] = {}
    for layer in k:
        tensors[f"k.{layer}"] = k[layer].to("cpu", memory_format=torch.contiguous_format, copy=True)
        tensors[f"v.{layer}"] = v[layer].to("cpu", memory_format=torch.contiguous_format, copy=True)
    meta = {"memory_kind": kind, "layers": ",".join(str(x) for x in k), **types}
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
            kv = name[0]
            codec = spec.codec_of(kv)
            have = state.meta.get(f"{kv}_type") or _PLAIN.get(t.dtype, str(t.dtype))  # files before the types: plain
            if have != codec.name or t.dtype != codec.storage:  # converting would round, or pretend a precision
                flag = "--cache-type-k" if kv == "k" else "--cache-type-v"
                raise StateMismatch(f"the state stores {kv.upper()} as {have}; this server as {codec.name} ({flag})")
            want = spec.stored_shape(kv, n, spec.n_kv_heads)
            if tuple(t.shape) != want:
                raise StateMismatch(f"{name} has shape {tuple(t.shape)}, want {want}")
    extra = set(state.tensors) - {f"{kv}.{layer}" for layer in specs for kv in "kv"}
    if extra:
        raise StateMismatch(f"state has unknown tensors {sorted(extra)[:4]}")
    return n
