"""A draft model for speculative decoding (llama-server's ``-md``, ``--spec-type
draft-simple``): a smaller checkpoint with the target's vocabulary proposes each
speculating sequence's next tokens greedily, and the target verifies them in its next
step (engine/core/speculation.py, engine/core/acceptance.py).

Its memory is of the same kind as the target's, one sequence beside each slot, and
follows the slot by comparison: it remembers which tokens it holds the cache of, and
before proposing keeps the longest prefix they share with the sequence's tokens,
computing the rest. So whatever happened to the slot meanwhile (rejected proposals, a
prefix copied in, a slot file restored, a context shift) costs the draft a recompute
of what differs and is never wrong. Nothing of the draft is saved with a slot.
"""

from __future__ import annotations

import dataclasses
import logging

import torch

from engine.config import EngineConfig
from engine.core.sequence import Sequence
from engine.kernels.packed_linear import onednn_available, pack_linears
from engine.loading.loaded import LoadedModel, load
from memory import CacheFull, MemoryBatch, MemoryConfig, build_memory

log = logging.getLogger("slotserve.engine")

VOCAB_SLACK = 128  # vocabularies may differ by padding rows at most this long (as llama-server allows)


class DraftModel:
    def __init__(self, config: EngineConfig, target: LoadedModel, memory_config: MemoryConfig):
        """Loads ``config.model_draft``; ValueError when its vocabulary is not the
        target's or its memory cannot drop rejected tokens."""
        own = dataclasses.replace(
            config, model=config.model_draft, quantization=None, chat_template=None, spec_type=None, model_draft=None
        )
        loaded = load(own)
        check_vocabulary(target, loaded, config.model_draft)
        self.model, self.device = loaded.model, own.torch_device
        self.vocab = min(target.model_config.vocab_size, loaded.model_config.vocab_size)
        if own.torch_device.type == "cpu" and own.torch_dtype == torch.float32 and onednn_available():
            if config.linear in ("auto", "onednn"):
                pack_linears(self.model)
        specs = self.model.layer_specs(own.torch_dtype)
        self.memory = build_memory(specs, memory_config)
        if not self.memory.cuts_anywhere:
            raise ValueError(
                f"draft model {config.model_draft}: its '{self.memory.kind}' memory cannot drop rejected "
                "proposals; a draft model needs attention layers only"
            )
        self.max_step = memory_config.max_step
        self.held: dict[int, list[int]] = {}  # seq_id -> the tokens the draft memory holds the cache of
        self.n_ctx_seq = min(memory_config.seq_cells, loaded.model_config.max_position_embeddings)

    @torch.inference_mode()
    def propose(self, wants: list[tuple[Sequence, int, float]]) -> list[list[int]]:
        """For each (sequence, n, p_min): up to n tokens the draft picks greedily after
        the sequence's tokens, ending before the first it gives less than ``p_min``.
        A failure proposes nothing (and forgets the draft's cache of those sequences)."""
        fits = [(s, n if len(s.tokens) + n <= self.n_ctx_seq else 0, p) for s, n, p in wants]
        wants = [w for w in fits if w[1] > 0]
        if not wants:
            return [[] for _ in fits]
        drafts = dict(zip((s.seq_id for s, _, _ in wants), self._guarded(wants)))
        return [drafts.get(s.seq_id, []) for s, _, _ in fits]

    def _guarded(self, wants: list[tuple[Sequence, int, float]]) -> list[list[int]]:
        try:
            try:
                return self._propose(wants)
            except CacheFull:  # idle slots' draft caches make room, then once more
                for seq_id in set(self.held) - {seq.seq_id for seq, _, _ in wants}:
                    self.memory.seq_rm(seq_id)
                    del self.held[seq_id]
                return self._propose(wants)
        except Exception:  # a proposal is only ever an offer: the target decodes as without one
            log.exception("the draft model failed; this step proposes nothing")
            for seq, _, _ in wants:
                self.memory.seq_rm(seq.seq_id)
                self.held[seq.seq_id] = []
            return [[] for _ in wants]

    def _propose(self, wants: list[tuple[Sequence, int, float]]) -> list[list[int]]:
        todo = {}
        for seq, _, _ in wants:
            held = self.held.get(seq.seq_id, [])
            n = _common_prefix(held, seq.tokens[:-1])  # the last token is fed anew: its row gives the first guess
            if not self.memory.seq_rm(seq.seq_id, n):
                self.memory.seq_rm(seq.seq_id)
                n = 0
            self.held[seq.seq_id] = seq.tokens[:n]
            todo[seq.seq_id] = seq.tokens[n:]
        nexts = self._catch_up(todo)  # seq_id -> (token, prob)
        drafts = {seq.seq_id: [] for seq, _, _ in wants}
        going = {seq.seq_id: n for seq, n, _ in wants}
        p_min = {seq.seq_id: p for seq, _, p in wants}
        while going:
            feed = {}
            for seq_id, (tok, prob) in nexts.items():
                if seq_id not in going:
                    continue
                if prob < p_min[seq_id]:
                    del going[seq_id]
                    continue
                drafts[seq_id].append(tok)
                if len(drafts[seq_id]) >= going[seq_id]:
                    del going[seq_id]
                else:
                    feed[seq_id] = [tok]
            nexts = self._forward(feed) if feed else {}
        return [drafts[seq.seq_id] for seq, _, _ in wants]

    def _catch_up(self, todo: dict[int, list[int]]) -> dict[int, tuple[int, float]]:
        """Compute every sequence's missing tokens, in steps of at most ``max_step``;
        the guess after each one's last token."""
        nexts = {}
        while todo:
            feed, budget = {}, self.max_step
            for seq_id, ids in list(todo.items()):
                if budget <= 0:
                    break
                feed[seq_id] = ids[:budget]
                budget -= len(feed[seq_id])
                if len(ids) <= len(feed[seq_id]):
                    del todo[seq_id]
                else:
                    todo[seq_id] = ids[len(feed[seq_id]) :]
            out = self._forward(feed)
            nexts.update((s, out[s]) for s in feed if s not in todo)
        return nexts

    def _forward(self, feed: dict[int, list[int]]) -> dict[int, tuple[int, float]]:
        """One forward of ``feed``'s tokens after each sequence's held ones; each
        sequence's greedy next token and its probability."""
        seq_ids = list(feed)
        starts = [len(self.held[s]) for s in seq_ids]
        ids = [t for s in seq_ids for t in feed[s]]
        pos = torch.cat([torch.arange(p, p + len(feed[s])) for s, p in zip(seq_ids, starts)])  # [T]
        batch = MemoryBatch(seq_ids, [len(feed[s]) for s in seq_ids], pos)
        view = self.memory.prepare(batch)
        last = torch.tensor(list(_last_rows(feed[s] for s in seq_ids)), dtype=torch.long)  # [S]
        try:
            logits = self.model(torch.tensor(ids, device=self.device), pos.to(self.device), view, last.to(self.device))
        except BaseException:
            for s, p in zip(seq_ids, starts):
                self.memory.seq_rm(s, p)
            raise
        for s in seq_ids:
            self.held[s] = self.held[s] + feed[s]
        probs = logits[:, : self.vocab].softmax(dim=-1)  # [S, V]
        best, tokens = probs.max(dim=-1)  # [S]
        return {s: (t, p) for s, t, p in zip(seq_ids, tokens.tolist(), best.tolist())}


def _last_rows(lengths):
    row = 0
    for ids in lengths:
        row += len(ids)
        yield row - 1


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def check_vocabulary(target: LoadedModel, draft: LoadedModel, path) -> None:
    """The draft must speak the target's tokens: same text for every id both have, the
    same EOS tokens, and at most ``VOCAB_SLACK`` ids of difference (padding)."""
    nt, nd = target.model_config.vocab_size, draft.model_config.vocab_size
    if abs(nt - nd) > VOCAB_SLACK:
        raise ValueError(f"draft model {path}: vocabulary of {nd} tokens, the target has {nt}")
    tv, dv = target.tokenizer.hf.get_vocab(), draft.tokenizer.hf.get_vocab()
    differ = [tok for tok, i in tv.items() if dv.get(tok, i) != i]
    if differ or len(tv) != len(dv):
        shown = ", ".join(repr(t) for t in differ[:3])
        raise ValueError(f"draft model {path}: its tokenizer is not the target's ({len(differ)} differ: {shown})")
    if target.tokenizer.eos_ids != draft.tokenizer.eos_ids:
        raise ValueError(f"draft model {path}: its end-of-sequence tokens differ from the target's")
