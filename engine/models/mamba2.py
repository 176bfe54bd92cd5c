"""Mamba2 (``Mamba2ForCausalLM``): every layer a state-space mixer, no attention.

Per layer: RMSNorm, then the mixer: one input projection into (gate, conv input,
dt); a causal depthwise convolution (its last ``conv_kernel - 1`` inputs carried per
sequence) and SiLU; the SSD scan over heads (chunked for prefill, one update per token
for decode; the state carried per sequence); a gated group RMSNorm; the output
projection. Memory is a ``RecurrentSpec`` per layer (memory/recurrent/recurrent_memory.py). Weight
names follow the checkpoint (``backbone.*``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from engine.errors import CheckpointError
from engine.models import rowwise
from engine.models.base import DecoderLM
from engine.models.config import ModelConfig
from engine.models.layers import RMSNorm, embedding
from engine.models.ssm import conv_step, conv_window, gated_group_rms_norm, mix, ssd_scan, ssd_step
from memory import ForwardView, LayerSpec
from memory.spec import RecurrentSpec


@dataclass(frozen=True)
class SSMShape:
    hidden: int
    n_heads: int
    head_dim: int
    state_size: int
    n_groups: int
    conv_kernel: int
    chunk: int
    eps: float
    use_bias: bool
    use_conv_bias: bool
    dt_limit: tuple[float, float]
    norm: str = "gate_then_norm"  # output: gate then group RMSNorm | "norm_then_gate" | "gate" (no norm)
    out_bias: bool | None = None  # out_proj's bias (None: as use_bias)

    @property
    def inner(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        return self.inner + 2 * self.n_groups * self.state_size

    @classmethod
    def from_raw(cls, raw: dict, hidden: int, prefix: str = "", source: str = "config.json") -> SSMShape:
        """From a config's fields; ``prefix`` is ``mamba_`` for the hybrids' spelling
        (``mamba_n_heads``, ``mamba_d_head``, ``mamba_d_state``, ``mamba_d_conv``...)."""

        def get(*names, default=None):
            for n in names:
                if raw.get(n) is not None:
                    return raw[n]
            if default is None:
                raise CheckpointError(f"{source}: required field '{names[0]}' is missing")
            return default

        if prefix:
            n_heads = int(get("mamba_n_heads"))
            head_dim = get("mamba_d_head", default="auto")
            if head_dim == "auto":  # the inner width split evenly over the heads
                inner = raw.get("mamba_d_ssm") or int(get("mamba_expand", default=2)) * hidden
                head_dim = int(inner) // n_heads
            head_dim = int(head_dim)
            state, groups = int(get("mamba_d_state")), int(get("mamba_n_groups", default=1))
            kernel, chunk = int(get("mamba_d_conv", default=4)), int(get("mamba_chunk_size", default=256))
            bias, conv_bias = bool(get("mamba_proj_bias", default=False)), bool(get("mamba_conv_bias", default=True))
        else:
            n_heads, head_dim = int(get("num_heads")), int(get("head_dim"))
            state, groups = int(get("state_size")), int(get("n_groups", default=1))
            kernel, chunk = int(get("conv_kernel", default=4)), int(get("chunk_size", default=256))
            bias, conv_bias = bool(get("use_bias", default=False)), bool(get("use_conv_bias", default=True))
        eps = float(get("layer_norm_epsilon", "rms_norm_eps", default=1e-5))
        return cls(hidden, n_heads, head_dim, state, groups, kernel, chunk, eps, bias, conv_bias, dt_limit(raw))

    def spec(self, dtype: torch.dtype) -> RecurrentSpec:
        return RecurrentSpec(
            (self.conv_dim, self.conv_kernel - 1), (self.n_heads, self.head_dim, self.state_size), dtype
        )


def dt_limit(raw: dict) -> tuple[float, float]:
    """The range the time step is clamped to: the config's ``time_step_limit`` (two
    numbers; transformers 5 writes infinity as {"__float__": "Infinity"}), by default
    none (0, inf), as transformers' scan and llama.cpp's (``time_step_min`` only
    initializes training)."""
    value = raw.get("time_step_limit") or (0.0, float("inf"))
    lo, hi = (float(v["__float__"]) if isinstance(v, dict) else float(v) for v in value)
    return lo, hi


class Mamba2Mixer(nn.Module):
    def __init__(self, s: SSMShape, layer: int, in_scale: float = 1.0):
        """``layer``: the memory layer id of its states; ``in_scale`` multiplies the input
        (Falcon-H1); ``mup``, when set, multiplies the input projection per channel."""
        super().__init__()
        self.s, self.layer, self.in_scale = s, layer, in_scale
        self.mup: torch.Tensor | None = None  # [inner + conv_dim + heads]
        self.in_proj = nn.Linear(s.hidden, s.inner + s.conv_dim + s.n_heads, bias=s.use_bias)
        self.conv1d = nn.Conv1d(s.conv_dim, s.conv_dim, s.conv_kernel, groups=s.conv_dim, bias=s.use_conv_bias)
        self.dt_bias = nn.Parameter(torch.zeros(s.n_heads))
        self.A_log = nn.Parameter(torch.zeros(s.n_heads))
        self.D = nn.Parameter(torch.zeros(s.n_heads))
        if s.norm != "gate":
            self.norm = RMSNorm(s.inner, s.eps)  # weight only: the gated group norm is in ssm.py
        self.out_proj = nn.Linear(s.inner, s.hidden, bias=s.use_bias if s.out_bias is None else s.out_bias)

    def forward(self, x: torch.Tensor, view: ForwardView) -> torch.Tensor:
        """x: [T, hidden] (the batch's sequences, each a run of rows) -> [T, hidden]."""
        s = self.s
        proj = self.in_proj(x * self.in_scale if self.in_scale != 1.0 else x)
        if self.mup is not None:
            proj = proj * self.mup
        gate, xbc, dt = proj.split([s.inner, s.conv_dim, s.n_heads], dim=-1)
        window, state = view.states(self.layer)  # [B, C, K - 1], [B, H, P, N]
        A = -torch.exp(self.A_log.float())  # [H]
        weight, bias = self.conv1d.weight[:, 0, :], self.conv1d.bias  # [C, K]

        def step(xbc, dt, window, state):  # one token per sequence, batched
            conv, window = conv_step(xbc, window, weight, bias)
            y, state = self._step(rowwise.silu(conv), dt, A, state)
            return y, window, state

        def run(b: int, rows: slice) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # one sequence's chunk
            conv, new_window = conv_window(xbc[rows], window[b], weight, bias)
            y, new_state = self._scan(rowwise.silu(conv), dt[rows], A, state[b])
            return y, new_window, new_state

        y, window, state = mix(view.batch, (xbc, dt), window, state, step, run)
        view.store(self.layer, window, state)
        if s.norm == "gate":
            y = (y * rowwise.silu(gate.float())).to(x.dtype)
        else:
            weight = self.norm.weight
            y = gated_group_rms_norm(y.to(x.dtype), gate, weight, s.n_groups, s.eps, s.norm == "norm_then_gate")
        return self.out_proj(y)

    def _split(self, xbc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Conv outputs [T, C] -> x [T, H, P], B and C [T, H, N] (groups repeated per head)."""
        s = self.s
        xs, B, C = xbc.split([s.inner, s.n_groups * s.state_size, s.n_groups * s.state_size], dim=-1)
        rep = s.n_heads // s.n_groups
        B = B.view(-1, s.n_groups, s.state_size).repeat_interleave(rep, dim=1)
        C = C.view(-1, s.n_groups, s.state_size).repeat_interleave(rep, dim=1)
        return xs.view(-1, s.n_heads, s.head_dim), B, C

    def _scan(self, xbc, dt, A, state) -> tuple[torch.Tensor, torch.Tensor]:
        """One sequence's chunk: [n, C] -> (y [n, inner], state)."""
        xs, B, C = self._split(xbc)
        dt = rowwise.softplus(dt.float() + self.dt_bias.float()).clamp(*self.s.dt_limit)  # [n, H]
        y, state = ssd_scan(xs, dt, A, B, C, self.D.float(), state, self.s.chunk)
        return y.reshape(-1, self.s.inner), state

    def _step(self, xbc, dt, A, state) -> tuple[torch.Tensor, torch.Tensor]:
        """One token per sequence: [B, C] -> (y [B, inner], states [B, H, P, N])."""
        xs, B, C = self._split(xbc)
        dt = rowwise.softplus(dt.float() + self.dt_bias.float())  # [B, H] (transformers' decode path does not clamp)
        y, state = ssd_step(xs.float(), dt, A, B.float(), C.float(), self.D.float(), state.float())
        return y.reshape(-1, self.s.inner), state


class Mamba2Block(nn.Module):
    def __init__(self, s: SSMShape, layer: int, eps: float):
        super().__init__()
        self.norm = RMSNorm(s.hidden, eps)
        self.mixer = Mamba2Mixer(s, layer)

    def forward(self, x: torch.Tensor, view: ForwardView) -> torch.Tensor:
        return x + self.mixer(self.norm(x), view)


class Mamba2ForCausalLM(DecoderLM):
    def __init__(self, cfg: ModelConfig):
        nn.Module.__init__(self)
        self.cfg = cfg
        self.ssm = SSMShape.from_raw(cfg.raw, cfg.hidden_size)
        eps = float(cfg.raw.get("layer_norm_epsilon", cfg.rms_norm_eps))
        self.backbone = nn.Module()
        self.backbone.embeddings = embedding(cfg.vocab_size, cfg.hidden_size)
        self.backbone.layers = nn.ModuleList(Mamba2Block(self.ssm, i, eps) for i in range(cfg.n_layers))
        self.backbone.norm_f = RMSNorm(cfg.hidden_size, eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.tie_weights()  # a tied head shares the table from the start (what keeps it in blocks)
        self._shards: dict[str, list[int]] = {}  # nothing fused: tensors load under their own names

    def tie_weights(self) -> None:
        if self.cfg.tie_word_embeddings and isinstance(self.lm_head, nn.Linear):
            self.lm_head.weight = self.backbone.embeddings.weight

    def init_buffers(self, device: torch.device) -> None:
        return None  # nothing computed

    def _target(self, name: str) -> tuple[str, int | None]:
        return name, None

    def layer_specs(self, dtype: torch.dtype) -> list[LayerSpec]:
        return [self.ssm.spec(dtype) for _ in range(self.cfg.n_layers)]

    def rope_shift(self, layer: int, k: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("Mamba2 has no positions to shift")

    def hidden(
        self, input_ids: torch.Tensor, positions: torch.Tensor, view: ForwardView, rows: torch.Tensor
    ) -> torch.Tensor:
        """input_ids, positions: [T]; rows: [S] -> final hidden states [S, hidden]."""
        x = self.backbone.embeddings(input_ids)  # [T, hidden]
        for layer in self.backbone.layers:
            x = layer(x, view)
        return self.backbone.norm_f(x[rows])  # [S, hidden]
