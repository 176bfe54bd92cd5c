"""sentence-transformers Dense modules after pooling (issue 54: EmbeddingGemma's
``2_Dense`` and ``3_Dense``, which take its 768-wide mean to 3072 and back). In a folder
they are the ``modules.json`` entries whose type ends in ``Dense``, each a folder with a
``config.json`` (``in_features``, ``out_features``, ``bias``, ``activation_function``:
a torch class path) and ``model.safetensors`` (``linear.weight`` [out, in],
``linear.bias``; ``pytorch_model.bin`` from sentence-transformers 2). A GGUF file
carries their weights alone (``dense_2``, ``dense_3``), applied without activation, as
llama.cpp applies them."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

from engine.errors import CheckpointError

ACTIVATIONS = {
    "torch.nn.modules.linear.Identity": nn.Identity,
    "torch.nn.modules.activation.Tanh": nn.Tanh,
    "torch.nn.modules.activation.ReLU": nn.ReLU,
    "torch.nn.modules.activation.GELU": nn.GELU,
    "torch.nn.modules.activation.Sigmoid": nn.Sigmoid,
    "torch.nn.modules.activation.SiLU": nn.SiLU,
}


def folder_dense(folder: Path, modules: list[dict]) -> nn.Sequential | None:
    """The Dense modules of ``modules`` (``modules.json``'s entries) in order, as one
    float32 module [*, in] -> [*, out]; None when there are none. CheckpointError for a
    module whose files are missing or do not fit its config."""
    layers: list[nn.Module] = []
    for entry in modules:
        if not str(entry.get("type", "")).endswith("Dense"):
            continue
        where = Path(folder) / str(entry.get("path", ""))
        try:
            cfg = json.loads((where / "config.json").read_text())
            tensors = _tensors(where)
            linear = nn.Linear(int(cfg["in_features"]), int(cfg["out_features"]), bias=bool(cfg.get("bias", True)))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{where}: not a readable Dense module: {exc}") from exc
        act = cfg.get("activation_function") or "torch.nn.modules.activation.Tanh"
        if act not in ACTIVATIONS:
            raise CheckpointError(f"{where / 'config.json'}: activation '{act}' is not supported")
        _fill(linear, tensors, where)
        layers += [linear, ACTIVATIONS[act]()]
    return nn.Sequential(*layers).eval().requires_grad_(False) if layers else None


def weights_dense(weights: list[torch.Tensor]) -> nn.Sequential | None:
    """Linear maps without bias or activation from weights [out, in], in order (a GGUF
    file's); None for none."""
    if not weights:
        return None
    layers = []
    for w in weights:
        linear = nn.Linear(w.shape[1], w.shape[0], bias=False)
        linear.weight.data.copy_(w)
        layers.append(linear)
    return nn.Sequential(*layers).eval().requires_grad_(False)


def out_features(dense: nn.Sequential) -> int:
    """The size of what ``dense`` answers (its last linear map's output)."""
    return [m for m in dense if isinstance(m, nn.Linear)][-1].out_features


def _tensors(where: Path) -> dict[str, torch.Tensor]:
    if (where / "model.safetensors").is_file():
        return load_file(where / "model.safetensors")
    return torch.load(where / "pytorch_model.bin", map_location="cpu", weights_only=True)


def _fill(linear: nn.Linear, tensors: dict[str, torch.Tensor], where: Path) -> None:
    wanted = {"linear.weight": linear.weight} | ({"linear.bias": linear.bias} if linear.bias is not None else {})
    for name, param in wanted.items():
        given = tensors.get(name)
        if given is None or tuple(given.shape) != tuple(param.shape):
            got = "missing" if given is None else f"shape {tuple(given.shape)}"
            raise CheckpointError(f"{where}: tensor '{name}' is {got}, expected {tuple(param.shape)}")
        with torch.no_grad():
            param.copy_(given.float())
