"""Runs one planned step: flat batch tensors -> memory.prepare -> model -> logits (and
the hidden states embedding sequences pool, engine/core/pooling.py)."""

from __future__ import annotations

import torch

from engine.core.media import mrope_positions
from engine.core.planner import Chunk
from engine.core.rope_switch import switch_of
from engine.kernels.lora_linear import LoRAState
from engine.models.base import DecoderLM
from memory import Memory, MemoryBatch


class ModelRunner:
    def __init__(self, model: DecoderLM, memory: Memory, device: torch.device, lora: LoRAState | None = None):
        self.model = model
        self.memory = memory
        self.device = device
        self.lora = lora

    @torch.inference_mode()
    def run(self, plan: list[Chunk]) -> torch.Tensor:
        """Compute the plan's tokens; return logits [S, vocab] for the chunks that sample,
        in plan order (a chunk with a proposal: one row per position). Advances each
        sequence's ``n_computed`` (by the proposal too: the engine cuts back what the
        model did not confirm). An embedding sequence's pooler gets the hidden states
        of the rows it needs. On failure the new positions are removed again, so memory
        is as before."""
        ids, positions, logit_rows, pooled_rows = [], [], [], []
        row = 0
        for chunk in plan:
            seq, start = chunk.seq, chunk.seq.n_computed
            ids += seq.tokens[start : start + chunk.n_tokens] + seq.draft  # a draft rides after the known token
            positions.append(torch.arange(start, start + chunk.n_tokens))
            if seq.pooler is not None:  # an embedding: the rows its pooling needs
                pooled_rows.append([row + r for r in seq.pooler.rows(start, chunk.n_tokens)])
            row += chunk.n_tokens
            if chunk.samples:  # a proposal's chunk: a row per position (the verification)
                logit_rows += range(row - 1 - len(seq.draft), row) if seq.draft else [row - 1]
        pos = torch.cat(positions)  # [T]
        media = self._media(plan)  # (rows, their tokens, visible) or None
        visible = media[2] if media is not None else None
        # rows that continue decoding (a verify step, or the accepted tokens again after a
        # rejection): each computed as its position's decode step would be
        steps = [c.seq.n_computed >= len(c.seq.prompt_ids) - 1 for c in plan]
        batch = MemoryBatch(
            [c.seq.seq_id for c in plan], [c.n_tokens for c in plan], pos, visible, steps if any(steps) else None
        )
        view = self.memory.prepare(batch)
        rows = logit_rows + [r for pooled in pooled_rows for r in pooled]
        self._set_lora(plan, len(ids))
        try:
            extra = {"media": (media[0].to(self.device), media[1])} if media is not None else {}
            if switch_of(self.model) is not None:  # LongRoPE: each row as its sequence turns (rope_switch.py)
                longs = [torch.full((c.n_tokens,), c.seq.rope_long) for c in plan]
                extra["rope_long"] = torch.cat(longs).to(self.device)
            if getattr(self.model, "mrope", False) and any(c.seq.media for c in plan):  # rotary positions [3, T]
                rope = [mrope_positions(c.seq.media, c.seq.n_computed, c.n_tokens) for c in plan]
                extra["rope_positions"] = torch.cat(rope, dim=1).to(self.device)
            hidden = self.model.hidden(
                torch.tensor(ids, device=self.device),
                pos.to(self.device),
                view,
                torch.tensor(rows, dtype=torch.long, device=self.device),
                **extra,
            )  # [S + P, hidden]
            logits = self.model.project(hidden[: len(logit_rows)])  # [S, V]
        except BaseException:
            self._set_lora([], 0)
            for c in plan:  # a recurrent state cannot drop the step: back to its last checkpoint
                seq_id, n = c.seq.seq_id, c.seq.n_computed
                if not self.memory.seq_rm(seq_id, n):
                    self.memory.seq_rm(seq_id, self.memory.seq_cut_point(seq_id, n))
            raise
        self._set_lora([], 0)
        at = len(logit_rows)
        for seq, pooled in zip((c.seq for c in plan if c.seq.pooler is not None), pooled_rows):
            seq.pooler.add(hidden[at : at + len(pooled)])  # [k, hidden]
            at += len(pooled)
        every = self.memory.checkpoint_every
        for c in plan:
            seq = c.seq
            seq.n_computed += c.n_tokens
            if every is None:  # windows: the prompt's end is the point to come back to
                if c.samples and not seq.output_ids:
                    self.memory.checkpoint(seq.seq_id, pin=True)
            elif not seq.output_ids and seq.n_computed == len(seq.tokens) - 1:  # all but the prompt's last token
                self.memory.checkpoint(seq.seq_id, pin=True)  # (the planner stops there): the same prompt again: one
            elif not seq.output_ids and seq.n_computed == seq.turn_start:  # the next chat turn starts here
                self.memory.checkpoint(seq.seq_id)
            elif seq.n_computed % every == 0:  # a spaced checkpoint
                self.memory.checkpoint(seq.seq_id)
        return logits

    def _media(self, plan: list[Chunk]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """The images this step computes (encoded: engine/core/media_encoder.py): their rows of the
        flat batch [M], their tokens [M, hidden], and every row's last visible position [T]
        (an image's rows see its last position where the model attends both ways within
        an image; None where it is causal)."""
        items, row = [], 0
        for chunk in plan:
            start = chunk.seq.n_computed
            for m in chunk.seq.media:
                if start <= m.start and m.end <= start + chunk.n_tokens:
                    items.append((row + m.start - start, m))
            row += chunk.n_tokens
        if not items:
            return None
        if any(m.features is None for _, m in items):  # the planner runs encoded images only
            raise ValueError("an image in the step is not encoded")
        visible = None
        if self.model.media_bidirectional:
            visible = torch.cat([torch.arange(c.seq.n_computed, c.seq.n_computed + c.n_tokens) for c in plan])  # [T]
            for first, m in items:
                visible[first : first + m.n_tokens] = m.end - 1
        rows = [torch.arange(first, first + m.n_tokens) for first, m in items]
        return torch.cat(rows), torch.cat([m.features for _, m in items]), visible

    def _set_lora(self, plan: list[Chunk], n_rows: int) -> None:
        """Each row's adapter scales for this forward (its sequence's; none: cleared)."""
        if self.lora is None:
            return
        if not plan:
            self.lora.scales, self.lora.active = None, []
            return
        n = self.lora.n_adapters
        per_seq = [(list(c.seq.lora[:n]) + [0.0] * n)[:n] for c in plan]
        counts = torch.tensor([c.n_tokens + len(c.seq.draft) for c in plan])
        scales = torch.tensor(per_seq, dtype=torch.float32).T.repeat_interleave(counts, dim=1)  # [n, T]
        self.lora.scales = scales.to(self.device)
        self.lora.active = [i for i in range(n) if bool(scales[i].any())]
