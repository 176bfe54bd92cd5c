"""How each Hugging Face tensor is got back from what llama.cpp's converter wrote:
undoing llama's interleaved rotary rows, Gemma's and Qwen3.5's norms stored with their
+1, Mamba's A stored as -exp(A_log), experts stacked into one tensor, gate and up
projections split apart. Each hook: (checkpoint, HF name,
GGUF name, read) -> the HF tensor, or None where the renamed tensor is right as it is
(archs.py's table names the hook of each architecture)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Protocol

import torch


class GGUFMetadata(Protocol):
    """What an architecture reads of a GGUF file (``GGUFCheckpoint`` is one)."""

    arch: str
    tensors: dict[str, tuple]  # name -> (type, row-major shape, offset, bytes)

    def get(self, key: str, default: Any = None) -> Any: ...

    def small_tensor(self, name: str) -> torch.Tensor: ...

    @property
    def vocab_size(self) -> int: ...


class Rows(Protocol):
    """A 2-D weight whose rows can be taken: a tensor, or one kept in blocks."""

    shape: Any

    def __getitem__(self, rows: torch.Tensor) -> Rows: ...


Read = Callable[[str], Any]  # GGUF tensor name -> tensor (row-major, float), or blocks where kept


def kv_heads(ck: GGUFMetadata) -> list[int]:
    """Per-layer KV head count (hybrids write 0 for recurrent layers)."""
    n = ck.get(f"{ck.arch}.attention.head_count_kv")
    heads = ck.get(f"{ck.arch}.attention.head_count") or 0
    layers = ck.get(f"{ck.arch}.block_count")
    if isinstance(n, list):
        return [int(x) for x in n]
    return [int(n if n is not None else heads)] * layers


def unpermute(w: Rows, n_head: int) -> Rows:
    """llama.cpp's interleaved rotary rows -> Hugging Face's rotate-half rows (whole rows
    move: a weight kept in blocks is permuted without decoding)."""
    rows = w.shape[0]
    order = torch.arange(rows).reshape(n_head, rows // n_head // 2, 2).transpose(1, 2).reshape(rows)  # [rows]
    return w[order]


def _layer(name: str) -> int:
    return int(re.search(r"\.(\d+)\.", name).group(1))


def _rotary(ck: GGUFMetadata, found: str, read: Read) -> torch.Tensor | None:
    if not found.endswith(("attn_q.weight", "attn_k.weight")):
        return None
    heads = ck.get(f"{ck.arch}.attention.head_count")
    if found.endswith("attn_k.weight"):
        heads = kv_heads(ck)[_layer(found)] or heads
    return unpermute(read(found), heads)


def llama_tensor(ck: GGUFMetadata, hf_name: str, found: str, read: Read) -> torch.Tensor | None:
    return _rotary(ck, found, read)


def gemma_tensor(ck: GGUFMetadata, hf_name: str, found: str, read: Read) -> torch.Tensor | None:
    if hf_name.endswith("norm.weight"):  # stored with the +1 that Gemma's RMSNorm adds
        return read(found) - 1.0
    return None


def ssm_tensor(ck: GGUFMetadata, hf_name: str, found: str, read: Read) -> torch.Tensor | None:
    """Mamba tensors: A back to A_log, conv weights to [channels, 1, kernel], the
    unsqueezed A and D and the grouped norm back to their shapes."""
    if found.endswith(("ssm_a", "ssm_d")):
        t = read(found)
        t = torch.log(-t) if hf_name.endswith(".A_log") else t  # stored as -exp(A_log)
        return t.squeeze(1) if t.dim() == 2 and t.shape[1] == 1 else t  # Mamba2's [heads, 1] -> [heads]
    if found.endswith("ssm_conv1d.weight"):
        return read(found).unsqueeze(1)
    if found.endswith("ssm_norm.weight"):
        return read(found).reshape(-1)  # [groups, inner / groups] -> [inner]
    return None


def granite_tensor(ck: GGUFMetadata, hf_name: str, found: str, read: Read) -> torch.Tensor | None:
    i = _layer(hf_name) if ".layers." in hf_name else -1
    if hf_name.endswith("block_sparse_moe.input_linear.weight"):
        return torch.cat([read(f"blk.{i}.ffn_gate_exps.weight"), read(f"blk.{i}.ffn_up_exps.weight")], dim=1)
    if hf_name.endswith("shared_mlp.input_linear.weight"):
        shared = "shexp" if f"blk.{i}.ffn_gate_shexp.weight" in ck.tensors else ""
        gate, up = (f"blk.{i}.ffn_{p}{'_' + shared if shared else ''}.weight" for p in ("gate", "up"))
        return torch.cat([read(gate), read(up)], dim=0)
    ssm = ssm_tensor(ck, hf_name, found, read)
    return ssm if ssm is not None else _rotary(ck, found, read)


def gemma4_tensor(ck: GGUFMetadata, hf_name: str, found: str, read: Read) -> torch.Tensor | None:
    """The router's scales the converter files under other tensors' names."""
    if hf_name.endswith(".router.scale"):
        return read(f"blk.{_layer(hf_name)}.ffn_gate_inp.scale")
    if hf_name.endswith(".router.per_expert_scale"):
        return read(f"blk.{_layer(hf_name)}.ffn_down_exps.scale")
    return None


def gemma3n_tensor(ck: GGUFMetadata, hf_name: str, found: str, read: Read) -> torch.Tensor | None:
    stacked = re.match(r"model\.altup_(unembed_)?projections\.(\d+)\.weight$", hf_name)
    if stacked:  # the converter stacks the three projections into one tensor
        return read("altup_unembd_proj.weight" if stacked.group(1) else "altup_proj.weight")[int(stacked.group(2))]
    return None


def jamba_tensor(ck: GGUFMetadata, hf_name: str, found: str, read: Read) -> torch.Tensor | None:
    expert = expert_tensor(ck, hf_name, read)
    return expert if expert is not None else ssm_tensor(ck, hf_name, found, read)


def lfm2_tensor(ck: GGUFMetadata, hf_name: str, found: str, read: Read) -> torch.Tensor | None:
    if found.endswith("shortconv.conv.weight"):
        return read(found).unsqueeze(1)  # [channels, kernel] -> the Conv1d's [channels, 1, kernel]
    return expert_tensor(ck, hf_name, read)


def fused_rows(ck: GGUFMetadata, hf_name: str) -> tuple[str, int, int] | None:
    """(the fused GGUF tensor, first row, rows) a projection is read from where the file
    keeps it fused: Phi-3's ``attn_qkv`` (q, k, v rows) and ``ffn_up`` (gate rows, then
    up); None elsewhere."""
    part = re.search(r"\.(\d+)\.\w+\.(q|k|v|gate|up)_proj\.weight$", hf_name)
    a = ck.arch
    if part is None or a != "phi3":
        return None
    i, kind = int(part.group(1)), part.group(2)
    if kind in ("gate", "up"):
        name = f"blk.{i}.ffn_up.weight"
        half = ck.tensors[name][1][0] // 2
        return name, 0 if kind == "gate" else half, half
    heads = ck.get(f"{a}.attention.head_count")
    d = ck.get(f"{a}.embedding_length") // heads
    q, kv = heads * d, (kv_heads(ck)[i] or heads) * d
    return f"blk.{i}.attn_qkv.weight", {"q": 0, "k": q, "v": q + kv}[kind], q if kind == "q" else kv


def phi3_tensor(ck: GGUFMetadata, hf_name: str, found: str, read: Read) -> torch.Tensor | None:
    """Phi-3's fused projections: each one's rows (in blocks, kept as blocks)."""
    source = fused_rows(ck, hf_name)
    if source is None:
        return None
    name, first, n = source
    return read(name)[torch.arange(first, first + n)]


def gpt_oss_tensor(ck: GGUFMetadata, hf_name: str, found: str, read: Read) -> torch.Tensor | None:
    """The experts' matrices and biases: each expert's rows of the stacked tensors."""
    bias = re.search(r"\.(\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.bias$", hf_name)
    if bias is not None:
        layer, e, kind = bias.groups()
        return read(f"blk.{layer}.ffn_{kind}_exps.bias")[int(e)]
    return expert_tensor(ck, hf_name, read)


def expert_hook(ck: GGUFMetadata, hf_name: str, found: str, read: Read) -> torch.Tensor | None:
    """Stacked experts (Qwen3-MoE, Qwen2-MoE); the rest as renamed."""
    return expert_tensor(ck, hf_name, read)


def expert_source(hf_name: str) -> tuple[str, int] | None:
    """(the layer's stacked GGUF tensor, the expert) an expert's matrix
    (``....<layer>.<mlp>.experts.<e>.<kind>_proj.weight``) is read from, or None."""
    expert = re.search(r"\.(\d+)\.\w+\.experts\.(\d+)\.(gate_proj|up_proj|down_proj|w1|w3|w2)\.weight$", hf_name)
    if expert is None:
        return None
    layer, x, kind = expert.groups()
    kind = {"w1": "gate", "w3": "up", "w2": "down"}.get(kind, kind.removesuffix("_proj"))  # LFM2 names w1, w3, w2
    return f"blk.{layer}.ffn_{kind}_exps.weight", int(x)


def expert_tensor(ck: GGUFMetadata, hf_name: str, read: Read) -> torch.Tensor | None:
    """One expert's matrix from the layer's stacked ``ffn_<kind>_exps`` [experts, out,
    in] (in blocks: [experts * out, in], the expert's rows); None for any other name."""
    source = expert_source(hf_name)
    if source is None:
        return None
    name, e = source
    stacked = read(name)
    if isinstance(stacked, torch.Tensor) and stacked.dim() == 3:
        return stacked[e]
    per = ck.tensors[name][1][1]  # an expert's rows
    return stacked[e * per : (e + 1) * per]


def qwen35_tensor(ck: GGUFMetadata, hf_name: str, found: str, read: Read) -> torch.Tensor | None:
    """Undo the converter: norms (but the gated one) stored with their +1, A as
    -exp(A_log), the conv as [channels, kernel], experts stacked, b and a fused per key
    head (Qwen3-Next's ``ssm_ba``). Qwen3.5's value heads stay in the file's tiled order
    (the model reads them so: its config says ``slotserve_value_heads_tiled``)."""
    a = ck.arch
    if hf_name.endswith("norm.weight") and not hf_name.endswith("linear_attn.norm.weight"):
        return read(found) - 1.0
    if "linear_attn." not in hf_name:
        return expert_tensor(ck, hf_name, read)
    n_k, n_v = ck.get(f"{a}.ssm.group_count"), ck.get(f"{a}.ssm.time_step_rank")
    per_k = n_v // n_k
    fused = f"blk.{_layer(hf_name)}.ssm_ba.weight"
    if hf_name.endswith(("in_proj_b.weight", "in_proj_a.weight")) and fused in ck.tensors:
        rows = torch.arange(n_k * 2 * per_k).view(n_k, 2, per_k)  # [Hk, (b, a), per]: each key head's b, then a
        return read(fused)[rows[:, int(hf_name.endswith("a.weight"))].flatten()]
    t = read(found)
    if hf_name.endswith(".A_log"):
        t = torch.log(-t)
    return t.unsqueeze(1) if hf_name.endswith("conv1d.weight") else t  # value heads stay tiled (archs.py)
