"""Mamba2's state-space mixer math in plain torch: the causal depthwise convolution
with its carried window, the chunked SSD scan (prefill), the one-token update (decode),
and the gated group RMSNorm. No model weights here; models/mamba2.py wires them.

Per head h the recurrence is
    state_t = exp(dt_t * A_h) * state_{t-1} + dt_t * x_t (outer) B_t
    y_t     = state_t . C_t + D_h * x_t
with x_t [head_dim], B_t and C_t [state_size], state [head_dim, state_size].
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.models import rowwise
from memory import MemoryBatch

try:
    from engine.kernels import _blocks
except ImportError:  # built by `pip install -e .` where a compiler exists
    _blocks = None


def conv_window(x: torch.Tensor, window: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
    """Causal depthwise convolution of one sequence's new inputs after its window.

    x: [n, C] new inputs; window: [C, K - 1] the inputs before them (zeros at the
    start); weight: [C, K]. Returns (outputs [n, C] before the activation, the new
    window [C, K - 1])."""
    full = torch.cat([window, x.t()], dim=1)  # [C, K - 1 + n]
    out = F.conv1d(full[None], weight[:, None, :], bias, groups=weight.shape[0])[0]  # [C, n]
    return out.t(), full[:, full.shape[1] - window.shape[1] :]


def mix(batch: MemoryBatch, inputs: tuple[torch.Tensor, ...], window, state, step, run):
    """A recurrent mixer's way through one step -> (outputs [T, ...], windows [B, ...],
    states [B, ...]) as the view stores them. ``inputs``: per-row tensors [T, ...];
    ``step(*rows, window, state)``: the decode step, one token per sequence over rows,
    windows and states [B', ...]; ``run(b, rows)``: batch sequence b's chunk (its rows of
    the flat batch, a slice) -> (outputs, window, state), unbatched.

    Every sequence one token: ``step`` once over the batch (decode). Otherwise each
    sequence on its own: one whose rows continue its decoding (``batch.steps(b)``, a
    verify step) through ``step`` a token at a time, so that each row comes out bit for
    bit as the decode step of its position would; the rest through ``run``."""
    n_tokens = batch.n_tokens
    if all(n == 1 for n in n_tokens):
        return step(*inputs, window, state)
    ys, windows, states, row = [], [], [], 0
    for b, n in enumerate(n_tokens):
        if batch.steps(b):
            w, s = window[b : b + 1], state[b : b + 1]
            for r in range(row, row + n):
                y, w, s = step(*(x[r : r + 1] for x in inputs), w, s)
                ys.append(y)
            w, s = w[0], s[0]
        else:
            y, w, s = run(b, slice(row, row + n))
            ys.append(y)
        windows.append(w)
        states.append(s)
        row += n
    return torch.cat(ys), torch.stack(windows), torch.stack(states)


def conv_step(x: torch.Tensor, window: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
    """One new input per sequence: x [B, C], window [B, C, K - 1] -> ([B, C], [B, C, K - 1]).
    With the compiled kernels one call that shifts ``window`` in place and returns it
    (engine/kernels/csrc/conv_impl.inc), else a new window."""
    if (
        _blocks is not None
        and window.dtype == torch.float32
        and window.device.type == "cpu"
        and window.is_contiguous()
        and x.dtype == torch.float32
        and x.stride(-1) == 1
    ):
        return _blocks.conv_step(x, window, weight, bias), window
    full = torch.cat([window, x[:, :, None]], dim=2)  # [B, C, K]
    out = (full * weight).sum(-1)  # [B, C]
    if bias is not None:
        out = out + bias
    return out, full[:, :, 1:]


def _segment_sums(a: torch.Tensor) -> torch.Tensor:
    """a: [..., Q] -> [..., Q, Q] with [t, s] = a[s+1] + ... + a[t] for s <= t, -inf above.
    Summed directly (masked cumsum), not as a difference of running sums, so long
    chunks keep their precision."""
    q = a.shape[-1]
    rep = a[..., None, :].expand(*a.shape, q).transpose(-1, -2)  # [..., Q(t), Q(s)] = a[t]
    strict = torch.ones(q, q, dtype=torch.bool, device=a.device).tril(-1)
    sums = rep.masked_fill(~strict, 0).cumsum(-2)  # [t, s] = sum of a[i] for s < i <= t
    return sums.masked_fill(~strict.logical_or(torch.eye(q, dtype=torch.bool, device=a.device)), float("-inf"))


def ssd_scan(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor,
    state: torch.Tensor,
    chunk: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked scan of one sequence from ``state``.

    x: [L, H, P]; dt: [L, H] (after softplus); A, D: [H]; B, C: [L, H, N] (groups
    already repeated per head); state: [H, P, N]. Returns (y [L, H, P], final state),
    in float32. Within a chunk the outputs are a masked "attention" of C against B;
    across chunks only the state is carried (one small recurrence per chunk)."""
    length, n_heads, head_dim = x.shape
    x, dt, B, C = x.float(), dt.float(), B.float(), C.float()
    state = state.float()
    ys = []
    for s in range(0, length, chunk):
        xc, dtc, Bc, Cc = x[s : s + chunk], dt[s : s + chunk], B[s : s + chunk], C[s : s + chunk]
        a = (dtc * A).t()  # [H, Q] log-decay per step
        decay_in = torch.exp(_segment_sums(a))  # [H, Q(t), Q(s)]
        scores = torch.einsum("thn,shn->hts", Cc, Bc) * decay_in  # [H, Q, Q]
        xdt = xc * dtc[..., None]  # [Q, H, P]
        y = torch.einsum("hts,shp->thp", scores, xdt)  # within the chunk
        run = a.cumsum(-1)  # [H, Q] decay from the chunk start to t (inclusive)
        y = y + torch.einsum("thn,hpn->thp", Cc, state) * torch.exp(run).t()[..., None]  # from the carried state
        to_end = torch.exp(run[:, -1:] - run)  # [H, Q] decay from s (exclusive) to the chunk end
        state = state * torch.exp(run[:, -1])[:, None, None] + torch.einsum("shn,hs,shp->hpn", Bc, to_end, xdt)
        ys.append(y)
    y = torch.cat(ys) + x * D[None, :, None]  # [L, H, P]
    return y, state


def ssd_step(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per sequence. x: [B, H, P]; dt: [B, H] (after softplus); B, C:
    [B, H, N]; state: [B, H, P, N] -> (y [B, H, P], new state)."""
    dt = dt[..., None]  # [B, H, 1]
    decay = torch.exp(dt * A[:, None])[..., None]  # [B, H, 1, 1]
    new = state * decay + (dt * B)[:, :, None, :] * x[..., None]  # [B, H, P, N]
    y = torch.einsum("bhpn,bhn->bhp", new, C) + x * D[:, None]
    return y, new


def gated_group_rms_norm(
    y: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, n_groups: int, eps: float, norm_first: bool = False
) -> torch.Tensor:
    """Mamba2's output norm: (y * silu(gate)) RMS-normalized within each of ``n_groups``
    groups of channels, times ``weight``; with ``norm_first`` (Falcon-H1's
    norm_before_gate) y is normalized and scaled first, then gated. y, gate: [T, d] ->
    [T, d] in y's dtype."""
    h = y.float() if norm_first else y.float() * rowwise.silu(gate.float())
    g = h.view(*h.shape[:-1], n_groups, -1)
    g = g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + eps)
    if norm_first:
        return (weight * g.view(h.shape) * rowwise.silu(gate.float())).to(y.dtype)
    return weight * g.view(h.shape).to(y.dtype)


# ---- Mamba1 (Jamba): a diagonal state per channel, A per (channel, state) -------------


def selective_scan(
    x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, D: torch.Tensor, state
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence, token by token. x, dt: [L, d] (dt after softplus); A: [d, N];
    B, C: [L, N]; D: [d]; state: [d, N] -> (y [L, d] before gating, final state), float32.
    state_t = exp(dt_t A) * state_{t-1} + dt_t B_t x_t;  y_t = state_t . C_t + D x_t."""
    x, dt, state = x.float(), dt.float(), state.float()
    decay = torch.exp(dt[:, :, None] * A)  # [L, d, N]
    inject = dt[:, :, None] * B.float()[:, None, :] * x[:, :, None]  # [L, d, N]
    ys = []
    for t in range(x.shape[0]):
        state = decay[t] * state + inject[t]
        ys.append(state @ C[t].float())  # [d]
    return torch.stack(ys) + x * D, state


def selective_step(
    x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, D: torch.Tensor, state
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per sequence: x, dt [b, d]; B, C [b, N]; state [b, d, N] -> (y [b, d], state)."""
    dt = dt.float()
    new = state.float() * torch.exp(dt[..., None] * A) + (dt[..., None] * B.float()[:, None, :]) * x.float()[..., None]
    y = torch.matmul(new, C.float()[..., None])[..., 0] + x * D
    return y, new
