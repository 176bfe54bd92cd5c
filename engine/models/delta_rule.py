"""The gated delta rule (Gated DeltaNet's recurrence, Qwen3.5 / Qwen3-Next), per value
head with its key head's q, k (L2-normed, q over sqrt(Dk)), a decay g <= 0 and a write
strength beta:

    S_t = exp(g_t) * S_{t-1};  S_t += k_t (outer) beta_t * (v_t - k_t . S_t);  y_t = q_t . S_t

``delta_step`` advances a batch of sequences one token (decode); ``delta_chunked`` runs
one sequence's tokens in chunks of C (prefill): within a chunk the writes are resolved
with one triangular solve (the WY form), so the work is matmuls over [C, C] and
[C, D] tiles plus one state update per chunk instead of one per token.
``delta_rule`` is the token-by-token form (the reference; short runs). Where the
compiled kernels are built, ``delta_step`` is one call (engine/kernels/csrc/delta_impl.inc:
two passes over the state instead of six; 3x faster for 8 sequences x 16 heads of
128 x 128 on 2 cores).

Shapes: q, k [n, H, Dk]; v [n, H, Dv]; g, beta [n, H]; state [H, Dk, Dv]; all float32.
"""

from __future__ import annotations

import torch

try:
    from engine.kernels import _blocks
except ImportError:  # built by `pip install -e .` where a compiler exists
    _blocks = None

CHUNK = 64  # tokens per chunk: [C, C] tiles small enough to stay in cache
SHORT = 8  # runs this short go token by token (less work than one chunk)


def delta_rule(q, k, v, g, beta, state):
    """One sequence, token by token -> (y [n, H, Dv], the new state [H, Dk, Dv])."""
    out = []
    for t in range(q.shape[0]):
        state = state * g[t].exp()[:, None, None]
        remembered = (state * k[t][:, :, None]).sum(-2)  # [H, Dv]
        state = state + k[t][:, :, None] * ((v[t] - remembered) * beta[t][:, None])[:, None, :]
        out.append((state * q[t][:, :, None]).sum(-2))
    return torch.stack(out), state


def delta_step(q, k, v, g, beta, state):
    """One token per sequence: q, k [B, H, Dk], v [B, H, Dv], g, beta [B, H], state
    [B, H, Dk, Dv] (updated in place and returned) -> (y [B, H, Dv], state)."""
    if _blocks is not None and state.device.type == "cpu" and state.dtype == torch.float32 and state.is_contiguous():
        return _blocks.delta_step(q, k, v, g, beta, state), state
    b, h, dk, dv = state.shape
    flat = state.view(b * h, dk, dv)
    flat.mul_(g.exp().reshape(b * h, 1, 1))
    kf = k.reshape(b * h, 1, dk)
    remembered = torch.bmm(kf, flat)  # [BH, 1, Dv]
    delta = (v.reshape(b * h, 1, dv) - remembered) * beta.reshape(b * h, 1, 1)
    flat.baddbmm_(kf.transpose(1, 2), delta)  # S += k^T delta
    y = torch.bmm(q.reshape(b * h, 1, dk), flat)  # [BH, 1, Dv]
    return y.view(b, h, dv), state


def delta_chunked(q, k, v, g, beta, state, chunk: int = CHUNK):
    """One sequence in chunks of ``chunk`` tokens -> (y [n, H, Dv], the new state)."""
    n, h, dk = k.shape
    if n <= SHORT:
        return delta_rule(q, k, v, g, beta, state)
    dv = v.shape[-1]
    pad = (-n) % chunk
    if pad:  # zero tokens: no decay (g = 0), no write (beta = 0), nothing read
        q, k, v = (torch.cat([x, x.new_zeros(pad, h, x.shape[-1])]) for x in (q, k, v))
        g, beta = (torch.cat([x, x.new_zeros(pad, h)]) for x in (g, beta))
    m = (n + pad) // chunk
    # [H, M, C, D] and [H, M, C]
    q, k, v = (x.view(m, chunk, h, -1).permute(2, 0, 1, 3) for x in (q, k, v))
    g, beta = (x.view(m, chunk, h).permute(2, 0, 1) for x in (g, beta))
    g = g.cumsum(-1)  # the decay from the chunk's start through each token
    lower = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    decay = (g[..., :, None] - g[..., None, :]).masked_fill(~lower, float("-inf")).exp()  # [H, M, C, C]
    kb = k * beta[..., None]
    # the writes within a chunk, resolved: T = (I + strictly_lower(beta k k^T decay))^-1
    a = (kb @ k.transpose(-1, -2) * decay).tril(-1)  # [H, M, C, C]
    eye = torch.eye(chunk, dtype=q.dtype, device=q.device)
    t = torch.linalg.solve_triangular(a + eye, eye.expand_as(a), upper=False, unitriangular=True)
    u = t @ (v * beta[..., None])  # [H, M, C, Dv]: what each token writes, before the state's share
    w = t @ (kb * g.exp()[..., None])  # [H, M, C, Dk]: how much of the state each token's write removes
    inner = (q @ k.transpose(-1, -2) * decay).masked_fill(~lower, 0)  # [H, M, C, C]
    out = torch.empty(h, m, chunk, dv, dtype=q.dtype, device=q.device)
    tail = (g[..., -1:] - g).exp()[..., None]  # [H, M, C, 1]: decay from each token to the chunk's end
    for i in range(m):
        s = state  # [H, Dk, Dv]
        fresh = u[:, i] - w[:, i] @ s  # [H, C, Dv]
        out[:, i] = (q[:, i] * g[:, i, :, None].exp()) @ s + inner[:, i] @ fresh
        state = s * g[:, i, -1, None, None].exp() + (k[:, i] * tail[:, i]).transpose(-1, -2) @ fresh
    return out.permute(1, 2, 0, 3).reshape(m * chunk, h, dv)[:n], state
