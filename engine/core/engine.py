"""The engine: model + memory + sampling, driven step by step.

Step-level API (what the server's scheduler drives from its one engine thread):
``add_sequence`` -> ``step`` (repeatedly; returns events) -> ``abort``/finish. A
finished sequence's cache stays in memory for reuse; the caller decides when to drop
it (``memory.seq_rm``). ``generate`` is the offline convenience built on the same API.
"""

from __future__ import annotations

import concurrent.futures
import logging
import random
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.config import EngineConfig
from engine.core.acceptance import TokenAcceptance
from engine.core.cache_specs import cache_specs, default_cache_type
from engine.core.context_shift import ContextShift
from engine.core.cuda_graphs import GraphLadder
from engine.core.device_memory import gpu_sized
from engine.core.draft_model import DraftModel
from engine.core.media import MediaItem, check_media
from engine.core.media_encoder import MediaEncoder
from engine.core.planner import Chunk, plan_step
from engine.core.pooling import Pooler, Pooling
from engine.core.reports import EngineReports
from engine.core.rope_switch import switch_crossed, switch_of
from engine.core.runner import ModelRunner
from engine.core.sequence import FinishReason, Sequence, StepEvent, TokenLogprob
from engine.core.speculation import Speculation
from engine.core.static_decode import StaticDecode, eligible_model
from engine.errors import StepFailed, check_token_ids
from engine.kernels.attention import install_decode_attention
from engine.kernels.block_model import block_modules, pack_block_linears, weight_bytes_by_type
from engine.kernels.blocks import log_kernel_choice
from engine.kernels.lora_linear import install_lora
from engine.kernels.packed_linear import onednn_available, pack_linears
from engine.kernels.quantize import quantize_linears
from engine.loading.checkpoint import Progress
from engine.loading.loaded import load
from engine.loading.lora import load_lora
from engine.sampling.grammar import BatchMasker, GrammarCompiler
from engine.sampling.params import SamplingParams
from engine.text.detokenizer import IncrementalDetokenizer, StopMatcher
from memory import CacheFull, MemoryConfig, build_memory

log = logging.getLogger("slotserve.engine")


def _settle(masks) -> None:
    """Wait for a mask computation whose result is no longer wanted (its error too)."""
    if masks is not None:
        concurrent.futures.wait([masks])


@dataclass
class Generation:
    text: str
    token_ids: list[int]
    finish_reason: str
    n_prompt: int
    logprobs: list[TokenLogprob]


class Engine(TokenAcceptance, ContextShift, EngineReports):
    def __init__(self, config: EngineConfig, progress: Progress | None = None):
        """``progress(tensors done, of total, bytes done, of total)`` hears of the load."""
        self.config = config
        # Denormal floats cost x86 cores ~100x per operation; decays through a chunk of
        # tokens (engine/models/delta_rule.py) make them by the thousand. Set before any
        # thread exists that torch computes on (threads inherit it): its OpenMP pool,
        # the server's engine thread.
        torch.set_flush_denormal(True)
        if config.n_threads:
            torch.set_num_threads(config.n_threads)
        elif config.torch_device.type == "cuda":  # the host's tensors are bookkeeping: no OpenMP pool to wake
            torch.set_num_threads(1)
        self.device = config.torch_device
        loaded = load(config, progress)
        self.model_config, self.tokenizer, self.model = loaded.model_config, loaded.tokenizer, loaded.model
        self.fingerprint = loaded.fingerprint
        self.checkpoint_pooling = loaded.pooling  # what the checkpoint asks embeddings to pool with (or None)
        self.rank_head = loaded.rank_head  # a reranker's score (engine/loading/rank_head.py), or None
        if config.quantization:  # before packing: the quantized layers are no nn.Linear any more
            quantize_linears(self.model, config.quantization)
            self.fingerprint = {**self.fingerprint, "quantization": config.quantization}
        self.in_blocks = bool(block_modules(self.model))  # GGUF blocks, or --quantization
        if self.in_blocks:
            packed = pack_block_linears(self.model) if config.repack else (0, 0)
            log_kernel_choice(packed)
        install_decode_attention()  # memory's decode rows attend in one compiled call, where built
        if self._use_onednn():
            pack_linears(self.model)
        adapters = [load_lora(p, self.model_config, config.torch_dtype) for p in config.lora]
        self.lora = install_lora(self.model, adapters) if adapters else None
        self.lora_labels = [(a.task_name, a.prompt_prefix) for a in adapters]  # GET /lora-adapters shows them
        if config.lora:  # slot files and disk entries record the adapter set they were made with
            self.fingerprint = {**self.fingerprint, "lora": ";".join(str(Path(p).resolve()) for p in config.lora)}
        self.weight_bytes = weight_bytes_by_type(self.model)  # resident, by type (/props, /metrics)
        layout = "unified" if config.kv_unified else "stream"
        self.memory_config = MemoryConfig(
            config.cache_cells,
            config.n_seq_max,
            config.block_size,
            self.device,
            layout,
            swa_full=config.swa_full,
            max_step=config.max_batch_tokens,
            n_checkpoints=config.swa_checkpoints,
            ssm_checkpoints=config.ssm_checkpoints,
            ssm_checkpoint_every=config.ssm_checkpoint_every,
        )
        default = default_cache_type(self.in_blocks, config.torch_dtype)
        types = (config.cache_type_k or default, config.cache_type_v or default)
        self.layer_specs = cache_specs(self.model.layer_specs(config.torch_dtype), self.n_ctx_seq, *types)
        if self.device.type == "cuda":  # the pool takes what free GPU memory allows; -c stays a cap
            self.memory_config = gpu_sized(self.memory_config, self.layer_specs, config, self.device)
            self.layer_specs = cache_specs(self.model.layer_specs(config.torch_dtype), self.n_ctx_seq, *types)
        self.memory = build_memory(self.layer_specs, self.memory_config, rope_shift=self.model.rope_shift)
        if config.context_shift and not self.memory.can_shift:
            raise ValueError(
                f"context shift needs a cache that can move positions; a '{self.memory.kind}' cache cannot "
                "(sliding-window layers: add --swa-full)"
            )
        self.runner = ModelRunner(self.model, self.memory, self.device, self.lora)
        self.rope_switch = switch_of(self.model)  # LongRoPE's original context (engine/core/rope_switch.py), or None
        self.encoder = MediaEncoder(self.model, self.device, config.max_batch_tokens)  # images, between steps
        self.static = self._static_decode()  # decode steps through static buffers (and graphs), or None
        self.running: list[Sequence] = []
        self.last_step_decode_only = False  # whether the last step's plan was one token per sequence
        self.n_checkpoint_restores = 0  # prefix reuses that restarted from a kept checkpoint
        self._rng = random.Random()
        self.grammars = GrammarCompiler(self.tokenizer, self.model_config.vocab_size)
        self.speculation = self._speculation(loaded)
        self._masker: BatchMasker | None = None

    def _speculation(self, loaded) -> Speculation:
        cfg = self.config
        if not cfg.spec_type:
            return Speculation()
        if not self.memory.cuts_anywhere:
            log.info(
                "speculative decoding (--spec-type %s) on a '%s' memory: each proposal is verified from a held "
                "checkpoint, rolled back to on rejection",
                cfg.spec_type,
                self.memory.kind,
            )
        draft = DraftModel(cfg, loaded, self.memory_config) if cfg.model_draft is not None else None
        return Speculation(cfg.spec_draft_max, cfg.spec_ngram_size, draft, cfg.spec_p_min, cfg.spec_draft_min)

    def _static_decode(self) -> StaticDecode | None:
        cfg = self.config
        wanted = cfg.static_decode if cfg.static_decode is not None else self.device.type == "cuda"
        if not wanted or self.in_blocks or not eligible_model(self.model, self.memory, self.lora):
            return None
        static = StaticDecode(self.model, self.memory, self.device, cfg.n_seq_max, self.n_ctx_seq)
        if self.device.type == "cuda" and not cfg.enforce_eager:
            static.graphs = GraphLadder(static.forward, static.sizes, self.device)
        return static

    def _use_onednn(self) -> bool:
        cfg = self.config
        eligible = self.device.type == "cpu" and cfg.torch_dtype == torch.float32 and onednn_available()
        return eligible and cfg.linear in ("auto", "onednn")

    @classmethod
    def from_pretrained(cls, path: str | None = None, **overrides) -> Engine:
        if path is not None:
            overrides["model"] = path
        return cls(EngineConfig(**overrides))

    @property
    def n_ctx_seq(self) -> int:
        """Most tokens one sequence may hold."""
        return min(self.memory_config.seq_cells, self.model_config.max_position_embeddings)

    # ---- step-level API --------------------------------------------------------

    def add_sequence(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        seq_id: int,
        n_cached: int = 0,
        n_keep: int = 0,
        pooling: Pooling | None = None,
        lora: tuple[float, ...] = (),
        media: list[MediaItem] | None = None,
        turn_start: int | None = None,
    ) -> Sequence:
        """Start generating for ``prompt_ids`` in memory sequence ``seq_id``.

        ``n_cached``: the caller guarantees memory already holds ``prompt_ids[:n_cached]``
        for ``seq_id`` (prefix reuse); everything after it is dropped. At least the last
        prompt token is recomputed so it yields logits. ``pooling``: an embedding, which
        ends once the prompt is computed, with its pooled hidden states (pooling other
        than ``last`` recomputes the whole prompt). ``lora``: each loaded adapter's scale
        for this sequence (missing ones: 0). ``media``: the prompt's images (engine/core/media.py),
        whose placeholders ``prompt_ids`` holds; a cached prefix never ends inside one.
        ``turn_start``: where a chat prompt's generation prompt begins (the next turn's
        history may write it otherwise, e.g. without ``<think>``): a memory that snapshots
        its state keeps one there, so that turn computes from it, not from further back. Raises
        ValueError on an empty or too long prompt, a busy ``seq_id``, a token outside the
        vocabulary, or media on a model without an image encoder or off their placeholders.
        """
        if not prompt_ids:
            raise ValueError("the prompt is empty")
        if len(prompt_ids) >= self.n_ctx_seq:
            raise ValueError(f"prompt of {len(prompt_ids)} tokens does not fit the context of {self.n_ctx_seq}")
        if any(s.seq_id == seq_id for s in self.running):
            raise ValueError(f"sequence {seq_id} is busy")
        check_token_ids(prompt_ids, self.model_config.vocab_size)
        media = sorted(media or [], key=lambda m: m.start)
        if media:
            check_media(self.model, self.model_config, prompt_ids, media)
        pooler = Pooler(pooling, len(prompt_ids), self.rank_head) if pooling is not None else None
        if pooler is not None and pooler.needs_whole_prompt:
            n_cached = 0
        n_cached = max(0, min(n_cached, len(prompt_ids) - 1, self.memory.seq_pos_max(seq_id) + 1))
        n_cached = min([n_cached] + [m.start for m in media if m.start < n_cached < m.end])  # an image runs whole
        n_cached = self.memory.seq_cut_point(seq_id, n_cached)
        restores = 0 < n_cached <= self.memory.seq_pos_max(seq_id) and n_cached in self.memory.checkpoints(seq_id)
        if not self.memory.seq_rm(seq_id, n_cached):
            self.memory.seq_rm(seq_id)
            n_cached = restores = 0
        self.n_checkpoint_restores += int(restores)  # back to a kept snapshot, not to the live end
        seed = (
            params.seed & (2**63 - 1) if params.seed is not None else self._rng.getrandbits(63)
        )  # int64 for the sampler
        seq = Sequence(
            seq_id=seq_id,
            prompt_ids=list(prompt_ids),
            params=params,
            seed=seed,
            detok=IncrementalDetokenizer(
                self.tokenizer, prompt_ids, skip_special=not self.config.special, keep=params.preserved
            ),
            stopper=StopMatcher(list(params.stop)),
            n_computed=n_cached,
            n_keep=max(0, min(n_keep, len(prompt_ids))),
            matcher=self.grammars.matcher(params.constraint) if params.constraint else None,
            pooler=pooler,
            lora=tuple(lora),
            media=media,
            turn_start=turn_start if turn_start is not None and n_cached < turn_start < len(prompt_ids) - 1 else None,
            rope_long=self.rope_switch is not None and len(prompt_ids) > self.rope_switch,
        )
        self.running.append(seq)
        return seq

    def abort(self, seq: Sequence) -> None:
        if seq in self.running:
            self.running.remove(seq)
            seq.finish_reason = seq.finish_reason or FinishReason.ABORT

    @property
    def has_work(self) -> bool:
        return bool(self.running)

    @torch.inference_mode()
    def step(self, keep_logits: bool = False) -> list[StepEvent]:
        """Run one forward for every planned token of every running sequence; sample
        where a chunk reaches the end of its tokens. Returns one event per planned
        sequence (``logits`` attached when ``keep_logits``).

        All or nothing: everything that may need room (context shifts, then
        ``memory.prepare``) happens before the forward. ``CacheFull`` leaves every
        sequence and the memory as they were, except that sequences shifted before the
        one that failed keep their (complete) shift.

        Faults stay with their sequence: an exception while shifting, planning, masking,
        sampling or accepting for one sequence ends that one alone, with an event that
        carries ``error`` (it leaves the running set); the others go on token for token
        as if it had not been there. Faults found before the forward are this step's
        only events (the rest run in the next step). A failing forward cannot be laid
        at one sequence's door: it raises ``StepFailed`` naming every planned sequence,
        which leave the running set."""
        faults = self._shift_full_contexts()
        faults += [self._fault(seq, exc) for seq, exc in self.encoder.advance(self.running)]
        self.speculation.propose(self.running, self.n_ctx_seq)
        switch_crossed(self.memory, self.running, self.rope_switch)  # LongRoPE: past the original context
        plan = self._plan(faults)
        if faults or not plan:
            return faults
        if not self.memory.cuts_anywhere:  # a proposal's rejected tokens are undone from a held checkpoint
            for c in plan:
                if c.seq.draft:
                    self.memory.hold(c.seq.seq_id)
        self.last_step_decode_only = all(c.n_tokens == 1 + len(c.seq.draft) for c in plan)
        constrained = [c.seq for c in plan if c.samples and c.seq.matcher is not None]
        masks = (  # computed during the forward
            self.masker.start([s.matcher for s in constrained], [s.draft for s in constrained]) if constrained else None
        )
        try:
            static = self.static is not None and self.static.serves(plan)
            logits = self.static.run(plan) if static else self.runner.run(plan)  # [S, V]
        except CacheFull:
            _settle(masks)  # the matchers are free again before anyone retries
            raise
        except Exception as exc:
            _settle(masks)
            raise self._step_failed([c.seq for c in plan], exc) from exc
        events = self._sample_and_accept(plan, logits, keep_logits, masks)
        self._end_embeddings(events)
        self.running = [s for s in self.running if not s.finished]
        return events

    @staticmethod
    def _end_embeddings(events: list[StepEvent]) -> None:
        """An embedding sequence whose prompt is computed ends, with its pooled vector."""
        for event in events:
            seq = event.seq
            if seq.pooler is not None and event.error is None and seq.n_pending == 0:
                seq.finish_reason, event.finished = FinishReason.STOP, True
                event.embedding = seq.pooler.result()

    def _plan(self, faults: list[StepEvent]) -> list[Chunk]:
        """The step's plan; when planning raises, each sequence is planned alone to
        find the ones it raises for (they become faults)."""
        budget, align = self.config.max_batch_tokens, self.memory.checkpoint_every
        try:
            return plan_step(self.running, budget, align)
        except Exception as exc:
            for seq in list(self.running):
                try:
                    plan_step([seq], budget, align)
                except Exception as own:
                    faults.append(self._fault(seq, own))
            if not faults:  # no one sequence is to blame: every running one fails
                raise self._step_failed(list(self.running), exc) from exc
            return []

    def _step_failed(self, seqs: list[Sequence], exc: Exception) -> StepFailed:
        for seq in seqs:
            self.abort(seq)
        return StepFailed(seqs, exc)

    def generate(
        self, prompts: list[str | list[int]], params: SamplingParams | list[SamplingParams]
    ) -> list[Generation]:
        """Generate for every prompt, all sequences batched together (in waves of
        ``n_seq_max``). Each wave starts from an empty memory."""
        plist = params if isinstance(params, list) else [params] * len(prompts)
        ids = [p if isinstance(p, list) else self.tokenizer.encode(p) for p in prompts]
        seqs: list[Sequence | None] = [None] * len(ids)
        todo = list(range(len(ids)))
        while todo or self.running:
            free = [s for s in range(self.config.n_seq_max) if all(r.seq_id != s for r in self.running)]
            while todo and free:
                i, slot = todo.pop(0), free.pop(0)
                self.memory.seq_rm(slot)
                seqs[i] = self.add_sequence(ids[i], plist[i], slot)
            self.step()
        return [Generation(s.text, s.output_ids, s.finish_reason.value, len(s.prompt_ids), s.logprobs) for s in seqs]
