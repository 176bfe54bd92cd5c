"""Engine configuration: a frozen dataclass validated once at start-up."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from engine.demo import DEMO_MODEL
from memory.kv_codec import CODECS

SPEC_TYPES = (None, "ngram-simple", "draft-simple")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class EngineConfig:
    """``n_ctx``: total cache cells (llama-server's ``-c``): with ``kv_unified`` one
    pool that one sequence may use all of, else ``n_ctx / n_seq_max`` cells per
    sequence (rounded up to whole blocks). ``n_seq_max``: sequences (slots).
    ``max_batch_tokens``: token budget of one step (``-b``)."""

    model: Path = DEMO_MODEL
    dtype: str = "auto"  # auto: bfloat16 on CUDA, float32 elsewhere
    device: str = "auto"
    block_size: int = 16
    n_ctx: int = 4096
    n_seq_max: int = 4
    max_batch_tokens: int = 512
    n_threads: int | None = None
    linear: str = "auto"  # auto | torch | onednn (prepacked; CPU float32 only)
    quantization: str | None = (
        None  # q8_0, q4_0, q4_k: linear weights into GGUF blocks at load (engine/kernels/quantize.py)
    )
    mmap: bool = True  # GGUF weights kept in blocks are the file's pages, mapped (llama.cpp's --mmap)
    repack: bool = True  # weights of PACKED types into 8-row groups at load (llama.cpp's --repack)
    context_shift: bool = False  # a full sequence drops old tokens instead of stopping
    kv_unified: bool = True  # one block pool for all sequences; False: a contiguous stream per sequence
    swa_full: bool = False  # sliding-window layers keep full-size caches (as llama.cpp's --swa-full)
    swa_checkpoints: int = 2  # windows kept per slot for cuts behind a sliding-window ring
    kv_cache_tokens: int | None = None  # cap on the cache's cells whatever n_ctx says
    ssm_checkpoints: int = 4  # recurrent-state snapshots kept per slot (prefix reuse and rollback)
    ssm_checkpoint_every: int | None = 512  # ... taken every this many tokens, besides each prompt's end
    chat_template: str | None = None  # a built-in template's name or jinja text; None: the model's own
    cache_type_k: str | None = None  # f32 | f16 | bf16 | q8_0 (llama-server's -ctk); None: default_cache_type
    cache_type_v: str | None = None  # the same for values (-ctv)
    spec_type: str | None = None  # ngram-simple | draft-simple: speculative decoding (engine/core/speculation.py)
    spec_draft_max: int = 48  # most tokens proposed a step (--spec-ngram-simple-size-m; --spec-draft-n-max)
    spec_draft_min: int = 0  # shorter proposals are not verified (--spec-draft-n-min)
    spec_p_min: float = 0.0  # a draft model's guess below this probability ends its proposal (--spec-draft-p-min)
    spec_ngram_size: int = 12  # tokens of the n-gram looked up (--spec-ngram-simple-size-n)
    model_draft: Path | None = None  # the draft model's checkpoint (-md), HF folder or GGUF
    mmproj: Path | None = None  # a GGUF model's multimodal projector file (llama-server's -mm)
    image_tokens: tuple[int | None, int | None] = (None, None)  # fewest, most tokens an image of a varying size takes
    special: bool = False  # special tokens are written into the output text (llama-server's -sp)
    rerank: bool = False  # score "yes" against "no" at a prompt's end (Qwen3-Reranker; engine/loading/rank_head.py)
    lora: tuple[str, ...] = ()  # LoRA adapters (GGUF files or PEFT folders), by index; each sequence says its scales
    static_decode: bool | None = None  # decode steps through static buffers (core/static_decode.py); None: CUDA
    enforce_eager: bool = False  # static decode steps run eagerly, never as captured CUDA graphs (vLLM's flag)
    gpu_memory_utilization: float = 0.9  # share of the GPU's memory weights, cache and activations may take

    @property
    def cache_cells(self) -> int:
        """Cells of the whole cache: ``n_ctx`` capped by ``kv_cache_tokens``."""
        return min(self.n_ctx, self.kv_cache_tokens or self.n_ctx)

    def __post_init__(self) -> None:
        object.__setattr__(self, "model", Path(self.model))
        if self.mmproj is not None:
            object.__setattr__(self, "mmproj", Path(self.mmproj))
        if self.dtype == "auto":
            cuda = self.torch_device.type == "cuda" and not self.quantization  # blocks run float32 activations
            object.__setattr__(self, "dtype", "bfloat16" if cuda else "float32")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError("gpu_memory_utilization must be in (0, 1]")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got '{self.dtype}'")
        for name in ("block_size", "n_ctx", "n_seq_max", "max_batch_tokens"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if self.kv_cache_tokens is not None and self.kv_cache_tokens <= 0:
            raise ValueError("kv_cache_tokens must be positive")
        if self.linear not in ("auto", "torch", "onednn"):
            raise ValueError("linear must be auto, torch or onednn")
        if self.quantization not in (None, "q8_0", "q4_0", "q4_k"):
            raise ValueError(f"quantization must be q8_0, q4_0 or q4_k, got '{self.quantization}'")
        if self.quantization and self.dtype != "float32":
            raise ValueError("--quantization runs float32 activations: use it with --dtype float32")
        if self.ssm_checkpoints < 0 or (self.ssm_checkpoint_every is not None and self.ssm_checkpoint_every <= 0):
            raise ValueError("ssm_checkpoints must be >= 0 and ssm_checkpoint_every positive")
        if self.n_threads is not None and self.n_threads <= 0:
            raise ValueError("n_threads must be positive")
        self._check_speculation()
        for flag, name in (("--cache-type-k", self.cache_type_k), ("--cache-type-v", self.cache_type_v)):
            if name is not None and name not in CODECS:
                raise ValueError(f"{flag} must be one of {', '.join(CODECS)}, got '{name}'")

    def _check_speculation(self) -> None:
        if self.model_draft is not None:
            object.__setattr__(self, "model_draft", Path(self.model_draft))
            if self.spec_type is None:  # -md alone speculates with it, as in llama-server
                object.__setattr__(self, "spec_type", "draft-simple")
        if self.spec_type not in SPEC_TYPES:
            names = ", ".join(t for t in SPEC_TYPES if t)
            raise ValueError(f"spec_type must be one of {names}, got '{self.spec_type}'")
        if (self.spec_type == "draft-simple") != (self.model_draft is not None):
            raise ValueError("--spec-type draft-simple goes with a draft model (-md FILE), and -md with it")
        if self.spec_draft_max < 0 or self.spec_draft_min < 0 or self.spec_ngram_size < 1:
            raise ValueError("spec_draft_max and spec_draft_min must be >= 0 and spec_ngram_size >= 1")
        if not 0 <= self.spec_p_min <= 1:
            raise ValueError("spec_p_min must be in [0, 1]")

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def torch_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)
