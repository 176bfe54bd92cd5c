"""Storage for a model built on the meta device."""

from __future__ import annotations

import torch


def materialize(model: torch.nn.Module, device: torch.device | str) -> torch.nn.Module:
    """``model.to_empty(device=device)``, without its cost: ``to_empty`` calls
    ``empty_like`` on each meta tensor, which goes through torch's Python reference ops,
    and their first use imports sympy and torch.fx's symbolic shapes (~0.6 s of CPU in
    each process that loads a model). Each parameter and buffer gets uninitialised
    storage of its shape, strides and dtype on ``device``; a parameter or buffer that
    two modules share stays one (``to_empty`` gave each its own). Returns ``model``."""
    made: dict[int, torch.Tensor] = {}

    def fresh(t: torch.Tensor) -> torch.Tensor:
        if id(t) not in made:
            storage = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=device)  # t's shape
            made[id(t)] = torch.nn.Parameter(storage, t.requires_grad) if isinstance(t, torch.nn.Parameter) else storage
        return made[id(t)]

    for module in model.modules():
        for table in (module._parameters, module._buffers):
            for name, t in table.items():
                if t is not None:
                    table[name] = fresh(t)
    return model
