"""Reading a Hugging Face checkpoint folder's weights (safetensors, sharded or not)."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from engine.errors import CheckpointError
from engine.kernels.blocks import BlockWeight
from engine.loading.block_plan import BlockPlan, finish_blocks, plan_blocks, route_blocks
from engine.loading.gguf.checkpoint import GGUFCheckpoint
from engine.loading.materialize import materialize
from engine.models.base import DecoderLM
from engine.models.config import ModelConfig
from engine.models.registry import model_class

INDEX = "model.safetensors.index.json"


def weight_files(folder: Path) -> list[Path]:
    index = folder / INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{index}: malformed index, field 'weight_map': {exc}") from exc
        files = [folder / f for f in sorted(set(weight_map.values()))]
        for f in files:
            if not f.is_file():
                raise CheckpointError(f"{index}: names shard '{f.name}', which is missing")
        return files
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{folder}: no *.safetensors weight file found")
    return files


def iter_tensors(files: list[Path]) -> Iterator[tuple[str, str, torch.Tensor]]:
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as handle:
                for name in handle.keys():
                    yield f.name, name, handle.get_tensor(name)
        except (SafetensorError, OSError) as exc:
            raise CheckpointError(f"{f}: cannot read safetensors file: {exc}") from exc


Progress = Callable[[int, int, int, int], None]  # (tensors done, of total, bytes done, of total)


def tensor_totals(files: list[Path]) -> tuple[int, int]:
    """(tensors, bytes) a Hugging Face folder's weight files hold."""
    n = 0
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as handle:
                n += len(list(handle.keys()))
        except (SafetensorError, OSError) as exc:
            raise CheckpointError(f"{f}: cannot read safetensors file: {exc}") from exc
    return n, sum(f.stat().st_size for f in files)


def _counted(tensors: Iterator, total: tuple[int, int], progress: Progress) -> Iterator:
    done = done_bytes = 0
    progress(0, total[0], 0, total[1])
    for item in tensors:
        yield item
        tensor = item[2]
        size = tensor.nbytes if isinstance(tensor, BlockWeight) else tensor.numel() * tensor.element_size()
        done, done_bytes = done + 1, done_bytes + size
        progress(done, total[0], min(done_bytes, total[1]), total[1])


def load_model(
    folder: Path,
    cfg: ModelConfig,
    dtype: torch.dtype,
    device: torch.device,
    gguf: GGUFCheckpoint | None = None,
    progress: Progress | None = None,
    mmproj=None,
) -> DecoderLM:
    """Build the registered class for ``cfg`` on ``device`` and fill it from ``folder``
    (a Hugging Face folder), or from ``gguf`` (the tensors the model names, read one at a
    time: those of layers kept in blocks as the file's bytes, the others dequantized).
    ``progress`` hears of each tensor copied. ``mmproj``: a GGUF model's projector file
    (engine/loading/gguf/mmproj.py), which holds the image encoder's weights."""
    cls = model_class(cfg.architecture, str(folder if gguf else folder / "config.json"))
    with torch.device("meta"):
        model = cls(cfg)
    names = model.checkpoint_names()
    vision = [n for n in names if n.startswith(model.media_prefixes)] if mmproj else []
    names = [n for n in names if n not in set(vision)]
    shapes = {n: p.shape for n, p in model.named_parameters() if n in set(vision)}
    plan = plan_blocks(model, gguf, names) if gguf is not None and device.type == "cpu" else BlockPlan()
    model = materialize(model, device).to(dtype)
    model.tie_weights()
    model.init_buffers(device)  # computed, not loaded: the meta-device build left them empty
    with torch.no_grad():
        if gguf is not None:
            tensors, total = gguf.iter_hf_tensors(names, plan.keep), (len(names) + len(vision), gguf.n_bytes)
            if vision:
                tensors = itertools.chain(tensors, mmproj.iter_weights(vision, shapes))
        else:
            files = weight_files(folder)
            tensors, total = iter_tensors(files), tensor_totals(files) if progress else (0, 0)
        tensors = _counted(tensors, total, progress) if progress else tensors
        model.load_weights(route_blocks(model, plan, tensors))
        finish_blocks(model, plan)
    return model.eval().requires_grad_(False)
