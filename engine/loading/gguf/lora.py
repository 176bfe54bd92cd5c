"""A GGUF LoRA adapter, as llama.cpp's convert_lora_to_gguf.py writes it and llama-server
loads it: ``general.type`` "adapter", ``adapter.type`` "lora", ``adapter.lora.alpha``,
and for each adapted weight ``W`` the tensors ``W.lora_a`` [r, in] and ``W.lora_b``
[out, r] (row-major), named as the base model's GGUF names ``W``.

Read into the pairs a PEFT folder gives (engine/loading/lora_adapter.py):
- the scaling is llama.cpp's, ``alpha / r`` with ``r`` from each ``lora_a`` (1 where
  alpha is 0 or missing), folded into each B;
- the converter moved the rows of ``lora_b`` as it moved the base weight's rows (llama's
  interleaved rotary q/k rows): the architecture's tensor hook
  (engine/loading/gguf/tensors.py) moves them back, as it does for the base model's.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from engine.errors import CheckpointError
from engine.loading.gguf.archs import ARCHITECTURES
from engine.loading.gguf.checkpoint import GGUFCheckpoint
from engine.loading.gguf.shards import OpenShards
from engine.loading.lora_adapter import LoRAAdapter
from engine.models.config import ModelConfig

# GGUF weight -> (PEFT module name, the Hugging Face block it sits in)
MODULES = {
    "attn_q": ("q_proj", "self_attn"),
    "attn_k": ("k_proj", "self_attn"),
    "attn_v": ("v_proj", "self_attn"),
    "attn_output": ("o_proj", "self_attn"),
    "ffn_gate": ("gate_proj", "mlp"),
    "ffn_up": ("up_proj", "mlp"),
    "ffn_down": ("down_proj", "mlp"),
}
_NAME = re.compile(r"^blk\.(\d+)\.(\w+)\.weight\.lora_([ab])$")
# converters that write another family's architecture name (Mistral's is llama's)
_ALSO = {"llama": {"MistralForCausalLM"}}


class _BaseHeads:
    """The base model's head counts under the metadata names the architecture hooks read
    (the adapter file does not carry them)."""

    def __init__(self, arch: str, base: ModelConfig, tensors: dict[str, tuple]):
        self.arch, self.tensors = arch, tensors
        self._fields = {
            f"{arch}.attention.head_count": base.n_heads,
            f"{arch}.attention.head_count_kv": base.n_kv_heads,
            f"{arch}.block_count": base.n_layers,
        }

    def get(self, key: str, default: Any = None) -> Any:
        return self._fields.get(key, default)


def load_gguf_lora(path: Path, base: ModelConfig, dtype: torch.dtype = torch.float32) -> LoRAAdapter:
    """Raises CheckpointError: not a LoRA adapter, an adapter for another architecture, a
    tensor that adapts no attention or MLP projection, a half of a pair alone, an
    activated LoRA (aLoRA: not served)."""
    ck = GGUFCheckpoint(path)
    if ck.get("general.type") != "adapter" or ck.get("adapter.type") != "lora":
        kind = f"{ck.get('general.type') or 'model'} {ck.get('adapter.type') or ''}".strip()
        raise CheckpointError(f"{path}: not a LoRA adapter (general.type/adapter.type: {kind})")
    if base.architecture != ARCHITECTURES[ck.arch].hf_class and base.architecture not in _ALSO.get(ck.arch, ()):
        raise CheckpointError(f"{path}: a LoRA for '{ck.arch}' models; this model is {base.architecture}")
    if ck.get("adapter.alora.invocation_tokens"):
        raise CheckpointError(f"{path}: activated LoRA (aLoRA) adapters are not served")
    alpha = float(ck.get("adapter.lora.alpha") or 0.0)
    halves: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    files = OpenShards(ck.shards)
    try:
        for name in ck.tensors:
            m = _NAME.match(name)
            if m is None or m[2] not in MODULES:
                raise CheckpointError(f"{path}: tensor {name!r} adapts no attention or MLP projection")
            halves.setdefault((int(m[1]), m[2]), {})[m[3]] = ck.tensor(name, files).float()
    finally:
        files.close()
    heads = _BaseHeads(ck.arch, base, ck.tensors)
    hook = ARCHITECTURES[ck.arch].tensor
    adapter = LoRAAdapter(
        str(path), 1.0, ck.get("adapter.lora.task_name") or "", ck.get("adapter.lora.prompt_prefix") or ""
    )
    for (layer, weight), pair in halves.items():
        if set(pair) != {"a", "b"}:
            raise CheckpointError(f"{path}: blk.{layer}.{weight} has lora_{''.join(pair)} alone")
        module, block = MODULES[weight]
        a, b = pair["a"], pair["b"]  # [r, in], [out, r]
        found = f"blk.{layer}.{weight}.weight"
        moved = hook(heads, f"model.layers.{layer}.{block}.{module}.weight", found, _only(found, b)) if hook else None
        b = moved if moved is not None else b
        scaling = alpha / a.shape[0] if alpha else 1.0
        adapter.pairs[(layer, module)] = (a.to(dtype), (b * scaling).to(dtype))
    return adapter


def _only(found: str, b: torch.Tensor):
    """The hook's reader: the one tensor it may ask for."""

    def read(name: str) -> torch.Tensor:
        if name != found:  # a weight rebuilt from several (split or stacked): not adaptable here
            raise CheckpointError(f"{found}: a LoRA on a weight the converter rebuilt is not served")
        return b

    return read
