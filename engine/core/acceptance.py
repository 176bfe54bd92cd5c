"""Turning a step's logits into tokens: grammar masks on the constrained rows, the
sampler, and each sampled token's acceptance (stop conditions, logprobs, detokenizing),
including the rows that verify a speculative proposal (engine/core/speculation.py).
A mixin of ``Engine``, which owns the state it reads (memory, tokenizer, running set)."""

from __future__ import annotations

import itertools
import time

import torch

from engine.core.sequence import FinishReason, Sequence, StepEvent, TokenLogprob
from engine.sampling.grammar import BatchMasker
from engine.sampling.reasoning_budget import utf8_complete
from engine.sampling.sampler import SampleOutput, SampleRow, sample

clock = time.monotonic  # what t_max_predict_ms is measured with (a test may stand in its own)


class TokenAcceptance:
    """What ``Engine`` provides: ``memory``, ``tokenizer``, ``model_config``, ``running``,
    ``n_ctx_seq``, ``speculation``, ``_masker`` (None until used) and ``_n_discard(seq)``."""

    @property
    def masker(self) -> BatchMasker:
        if self._masker is None:
            self._masker = BatchMasker(self.model_config.vocab_size)
        return self._masker

    def _sample_and_accept(self, plan: list, logits: torch.Tensor, keep_logits: bool, masks=None) -> list[StepEvent]:
        """One event per sampled token: a sequence with a proposal (speculation.py) gets
        its rows' tokens for as long as they confirm the proposal, then memory forgets
        the positions they did not confirm."""
        samplers = [c.seq for c in plan if c.samples]
        first = list(itertools.accumulate((1 + len(s.draft) for s in samplers), initial=0))  # each one's first row
        kept = logits.clone() if keep_logits else None
        broken = self._apply_masks(samplers, first, logits, masks)
        for i, seq in enumerate(samplers):  # a spent reasoning budget forces the block's end, token by token
            forced = seq.budget.forced() if seq.budget is not None else None
            if forced is not None:
                logits[first[i], :forced] = float("-inf")  # (budget sequences are not speculated: one row)
                logits[first[i], forced + 1 :] = float("-inf")
        rows = [  # row j of a proposal: sampled as if its first j tokens were already output
            SampleRow(s.params, s.seed, s.prompt_ids, s.output_ids + s.draft[:j], s.mirostat_mu)
            for s in samplers
            for j in range(1 + len(s.draft))
        ]
        outputs = self._sample(logits, rows)
        events = [StepEvent(c.seq, None, "", False) for c in plan if not c.samples]
        for i, seq in enumerate(samplers):
            n_confirmed = 0
            for j in range(1 + len(seq.draft)):
                out = broken.get(i) or outputs[first[i] + j]
                if isinstance(out, BaseException):
                    events.append(self._fault(seq, out))
                    break
                try:
                    event = self._accept(seq, *out)
                except Exception as exc:
                    events.append(self._fault(seq, exc))
                    break
                if kept is not None:
                    event.logits = kept[first[i] + j]
                event.n_output = len(seq.output_ids)
                if event.token_id is not None and seq.logprobs and len(seq.logprobs) == event.n_output:
                    event.logprob = seq.logprobs[-1]
                events.append(event)
                if event.finished or j == len(seq.draft) or event.token_id != seq.draft[j]:
                    break
                n_confirmed += 1
            if seq.draft:
                self._settle_draft(seq, n_confirmed)
        return events

    def _settle_draft(self, seq: Sequence, n_confirmed: int) -> None:
        """Keep the cache of the proposal's first ``n_confirmed`` tokens, drop the rest.
        A memory that cannot cut there goes back to the checkpoint held before the step
        (or an older one): the tokens after it are computed again next step."""
        start = seq.n_computed - 1 - len(seq.draft)  # the step computed the known token and the proposal
        keep = min(start + 1 + n_confirmed, len(seq.tokens))
        if keep < seq.n_computed and not self.memory.seq_rm(seq.seq_id, keep):
            keep = self.memory.seq_cut_point(seq.seq_id, keep)
            if not self.memory.seq_rm(seq.seq_id, keep):
                raise RuntimeError(f"sequence {seq.seq_id}: memory refused its own cut point {keep}")
        seq.n_computed = keep
        self.speculation.settled(seq, n_confirmed)
        seq.draft = []

    def _apply_masks(
        self, samplers: list[Sequence], first: list[int], logits: torch.Tensor, masks
    ) -> dict[int, BaseException]:
        """Grammar masks on the constrained rows (``first``: each sampler's first row;
        a proposal's rows are masked too, each by the grammar's state after the tokens
        before it); when computing them failed, those samplers fail (returned by index)
        and the others go on."""
        if masks is None:
            return {}
        which = [i for i, s in enumerate(samplers) if s.matcher is not None]
        constrained = [r for i in which for r in range(first[i], first[i + 1])]
        try:
            sub = logits[constrained]  # [R, V]
            self.masker.apply(masks, sub)
        except Exception as exc:
            return dict.fromkeys(which, exc)
        logits[constrained] = sub
        return {}

    @staticmethod
    def _sample(logits: torch.Tensor, rows: list[SampleRow]) -> list[tuple[SampleOutput, int] | BaseException]:
        """(output, its row) per row; when the batch raises, each row is sampled alone:
        the same tokens (a row's draw depends on that row only), and the rows that
        raise get their exception."""
        if not rows:
            return []
        try:
            out = sample(logits, rows)
            return [(out, i) for i in range(len(rows))]
        except Exception:
            pass
        results: list[tuple[SampleOutput, int] | BaseException] = []
        for i, row in enumerate(rows):
            try:
                results.append((sample(logits[i : i + 1].clone(), [row]), 0))
            except Exception as exc:
                results.append(exc)
        return results

    def _fault(self, seq: Sequence, exc: BaseException) -> StepEvent:
        """``seq`` leaves the running set; its event carries the error."""
        if seq in self.running:
            self.running.remove(seq)
        seq.finish_reason = seq.finish_reason or FinishReason.ABORT
        return StepEvent(seq, None, "", True, error=exc)

    def _accept(self, seq: Sequence, out: SampleOutput, row: int) -> StepEvent:
        if len(seq.output_ids) >= seq.params.max_tokens:
            return self._finish(seq, None, "", FinishReason.LENGTH)
        tok = out.tokens[row]
        seq.tokens.append(tok)
        seq.output_ids.append(tok)
        if seq.budget is not None:
            seq.budget.accept(tok, utf8_complete(self.tokenizer.token_bytes(tok)))
        if out.mu is not None and out.mu[row] is not None:
            seq.mirostat_mu = out.mu[row]
        if out.logprobs is not None and seq.params.logprobs is not None:
            n = seq.params.logprobs
            top = list(zip(out.top_ids[row][:n], out.top_logprobs[row][:n])) if out.top_ids else []
            seq.logprobs.append(TokenLogprob(tok, out.logprobs[row], top))
        if tok in self.tokenizer.eos_ids and not seq.params.ignore_eos:
            return self._finish(seq, tok, "", FinishReason.STOP)
        grammar_done = seq.matcher is not None and (not seq.matcher.consume_token(tok) or seq.matcher.is_stopped())
        result = seq.stopper.push(seq.detok.push(tok))
        if result.stop is not None:
            seq.stop_string = result.stop
            return self._finish(seq, tok, result.text, FinishReason.STOP, flush=False)
        cut = seq.indent.push(result.text) if seq.indent is not None else None
        if cut is not None:  # a line indented less than n_indent: cut at its first other character
            return self._finish(seq, tok, result.text[:cut], FinishReason.LENGTH, flush=False)
        if grammar_done:  # the grammar admits nothing more
            return self._finish(seq, tok, result.text, FinishReason.STOP)
        if len(seq.tokens) >= self.n_ctx_seq and self._n_discard(seq) <= 0:
            return self._finish(seq, tok, result.text, FinishReason.LENGTH)
        if len(seq.output_ids) >= seq.params.max_tokens:
            return self._finish(seq, tok, result.text, FinishReason.LENGTH)
        if seq.params.t_max_predict_ms > 0 and self._out_of_time(seq, "\n" in result.text):
            return self._finish(seq, tok, result.text, FinishReason.LENGTH)
        seq.text += result.text
        return StepEvent(seq, tok, result.text, False)

    @staticmethod
    def _out_of_time(seq: Sequence, newline: bool) -> bool:
        """llama-server's ``t_max_predict_ms``: a newline written once that long has passed
        since the first token."""
        now = clock()
        if seq.first_token_at is None:
            seq.first_token_at = now
        return newline and (now - seq.first_token_at) * 1000 > seq.params.t_max_predict_ms

    def _finish(self, seq: Sequence, tok: int | None, text: str, reason: FinishReason, flush: bool = True) -> StepEvent:
        if flush:
            text += seq.stopper.push(seq.detok.flush()).text + seq.stopper.flush()
        seq.text += text
        seq.finish_reason = reason
        return StepEvent(seq, tok, text, True)

    # ---- offline ---------------------------------------------------------------
