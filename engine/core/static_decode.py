"""Decode steps with fixed shapes, replayable as CUDA graphs.

A decode-only step (one new token per sequence) of a plain attention model runs through
static device buffers: token ids, positions, lengths, the new keys' rows and the block
tables (memory/attention/decode_tables.py) live in one int64 buffer [n_max, 4 + width],
filled on the host and copied in one non-blocking transfer; the batch is padded to the
next size of a ladder (1, 2, 4, 8, then multiples of 8 up to ``-np``) by repeating its
first row, whose duplicate computes the same key and writes the same bytes to the same
cell. Every tensor shape in the forward is then a function of the ladder size alone, so
on CUDA each size is captured once (``cuda_graphs.py``) and replayed. The same code runs
eagerly where graphs are off (``--enforce-eager``) and on the CPU, where tests check it.

What it serves (``eligible``): a ``DecoderLM`` (Llama, Mistral, Qwen 2/3 ...) without
LoRA or blocks, every layer full attention with plain stored rows in the model's dtype,
in a unified (paged) or per-stream cache. Anything else (prefill chunks, proposals,
embeddings, sliding windows, recurrent layers, quantized caches) keeps the general path.
"""

from __future__ import annotations

import torch

from engine.core.planner import Chunk
from engine.kernels.table_attention import TableLayout, table_attention
from engine.models.base import DecoderLM
from memory import ForwardView, FullAttentionSpec, Memory, MemoryBatch
from memory.attention.decode_tables import flat_rows

META = 4  # leading columns of the step buffer: id, position, length, write row; then the table


def ladder(n_max: int) -> list[int]:
    """Batch sizes a step is padded to: 1, 2, 4, 8, 16, 24, ... (multiples of 8), and n_max."""
    sizes = [s for s in (1, 2, 4) if s < n_max] + list(range(8, n_max, 8))
    return sizes + [n_max]


def kv_tensors(memory: Memory):
    """The object holding a full-attention memory's ``k`` and ``v`` dicts (layer -> cache)."""
    return memory.store if memory.kind == "kv_unified" else memory


def eligible_model(model: torch.nn.Module, memory: Memory, lora) -> bool:
    """Whether ``StaticDecode`` can run this model over this memory."""
    if not isinstance(model, DecoderLM) or lora is not None or memory.kind not in ("kv_stream", "kv_unified"):
        return False
    specs = memory.specs  # layer -> spec: every layer stores its own full-attention cache
    dtype = next(model.parameters()).dtype
    if sorted(specs) != list(range(model.cfg.n_layers)):
        return False
    return (
        all(
            type(s) is FullAttentionSpec and s.k_codec.storage == s.v_codec.storage == dtype and not s.k_codec.block
            for s in specs.values()
        )
        and type(model).hidden is DecoderLM.hidden  # Gemma's own (scaled embeddings, soft caps): not served
    )


class StaticDecodeView(ForwardView):
    """Attention for a padded decode batch through device buffers: store each row's new
    key and value at its write row, then attend to the row's ``lens`` keys."""

    def __init__(self, memory: Memory, buf: torch.Tensor, n_kv_heads: int, lay: TableLayout):
        """``buf``: the step buffer's first rows [B, META + width] on the device."""
        kv = kv_tensors(memory)
        self.k = {layer: flat_rows(t) for layer, t in kv.k.items()}  # layer -> [R, D]
        self.v = {layer: flat_rows(t) for layer, t in kv.v.items()}
        self.lens, self.table = buf[:, 2], buf[:, META:]  # [B], [B, width]
        heads = torch.arange(n_kv_heads, device=buf.device) * lay.stride_head  # [KVH]
        self.rows = (buf[:, 3:4] + heads).flatten()  # [B * KVH] flat rows of the new keys
        self.n_kv_heads, self.lay = n_kv_heads, lay

    def attend(self, layer, q, k, v, scale=None, softcap=None, sinks=None) -> torch.Tensor:
        if softcap is not None or k is None or sinks is not None:
            raise NotImplementedError("static decode serves plain full attention")
        k_rows, v_rows = self.k[layer], self.v[layer]
        head_dim = q.shape[-1]
        k_rows.index_copy_(0, self.rows, k.reshape(-1, head_dim).to(k_rows.dtype))  # [B * KVH, D]
        v_rows.index_copy_(0, self.rows, v.reshape(-1, head_dim).to(v_rows.dtype))
        scale = head_dim**-0.5 if scale is None else scale
        return table_attention(q, k_rows, v_rows, self.table, self.lens, self.n_kv_heads, self.lay, scale)


class StaticDecode:
    """Runs decode-only plans through the static buffers; ``graphs`` (cuda_graphs.py)
    replays captured sizes when set."""

    def __init__(self, model: DecoderLM, memory: Memory, device: torch.device, n_max: int, max_seq_cells: int):
        self.model, self.memory, self.device = model, memory, device
        self.sizes = ladder(n_max)
        self.lay = self._layout()
        self.width = -(-max_seq_cells // self.lay.block) + 1  # table entries a sequence can need
        pin = device.type == "cuda"
        self.host = torch.zeros(n_max, META + self.width, dtype=torch.long, pin_memory=pin)  # [n_max, META + width]
        self.buf = torch.zeros(n_max, META + self.width, dtype=torch.long, device=device)
        self.buf[:, 2] = 1  # before any step: every row attends to cell 0 of sequence 0's first block
        self.n_kv_heads = model.cfg.n_kv_heads
        self.graphs = None  # cuda_graphs.GraphLadder, once captured
        self.n_steps = self.n_replays = 0

    def _layout(self) -> TableLayout:
        """The strides of this memory's layout (memory/attention/decode_tables.py)."""
        k = next(iter(kv_tensors(self.memory).k.values()))
        if self.memory.kind == "kv_stream":  # [S, KVH, C, D]
            n_kv_heads, cells = k.shape[1], k.shape[2]
            return TableLayout(cells, n_kv_heads * cells, cells, 1)
        bs, n_kv_heads = self.memory.block_size, k.shape[1]  # [cells, KVH, D]
        return TableLayout(bs, bs * n_kv_heads, 1, n_kv_heads)

    @staticmethod
    def serves(plan: list[Chunk]) -> bool:
        """Decode rows alone: one known token per sequence, sampled, no proposal or pooling."""
        return bool(plan) and all(c.n_tokens == 1 and c.samples and not c.seq.draft for c in plan)

    def size_for(self, n: int) -> int:
        return next(s for s in self.sizes if s >= n)

    def forward(self, size: int) -> torch.Tensor:
        """The padded batch of the buffer's first ``size`` rows -> logits [size, V] float32."""
        buf = self.buf[:size]
        view = StaticDecodeView(self.memory, buf, self.n_kv_heads, self.lay)
        rows = torch.arange(size, device=self.device)
        hidden = self.model.hidden(buf[:, 0], buf[:, 1], view, rows)  # [size, hidden]
        return self.model.project(hidden)  # [size, V]

    @torch.inference_mode()
    def run(self, plan: list[Chunk]) -> torch.Tensor:
        """Compute the plan's decode tokens -> logits [n, V] (advances ``n_computed``).
        On failure the new positions are removed again."""
        seqs = [c.seq for c in plan]
        n = len(seqs)
        positions = torch.tensor([s.n_computed for s in seqs], dtype=torch.long)
        view = self.memory.prepare(MemoryBatch([s.seq_id for s in seqs], [1] * n, positions))
        try:
            tables = view.decode_tables()
            size = self.size_for(n)
            host = self.host[:size]
            host[:n, 0] = torch.tensor([s.tokens[s.n_computed] for s in seqs], dtype=torch.long)
            host[:n, 1] = positions
            host[:n, 2] = tables.lens
            host[:n, 3] = tables.write_rows
            host[:n, META:] = 0
            host[:n, META : META + tables.table.shape[1]] = tables.table
            host[n:] = host[0]  # padding: the first row again
            self.buf[:size].copy_(host, non_blocking=True)
            if self.graphs is not None:
                logits = self.graphs.replay(size)
                self.n_replays += 1
            else:
                logits = self.forward(size)
            self.n_steps += 1
            logits = logits[:n]
        except BaseException:
            for s in seqs:
                self.memory.seq_rm(s.seq_id, s.n_computed)
            raise
        for c in plan:
            c.seq.n_computed += 1
            if not c.seq.output_ids and self.memory.checkpoint_every is None:  # a window's prompt end
                self.memory.checkpoint(c.seq.seq_id)  # (recurrent states snapshot one token before: runner.py)
        return logits
