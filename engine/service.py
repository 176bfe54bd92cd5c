"""The engine as the HTTP side sees it: one facade over the engine, its scheduler
thread and slot files. ``server/`` uses this, the request and event types
(``engine.request``), sampling parameters and engine errors, and nothing deeper: it
never reaches into the scheduler, the slot table or memory, and never touches tensors.

Thread contract: the constructor loads the model (slow; the server runs it in a loader
thread) and ``start`` starts the engine thread; everything else is called from the
event loop. What reads or changes memory runs on the engine thread between two steps.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from engine.config import EngineConfig
from engine.core.engine import Engine
from engine.core.media import KEY_MIN, MediaItem
from engine.errors import BadSlotFile, NoRoom, SlotError, SlotFilesOff
from engine.instance_cache import instance_cache
from engine.loading.pooling_hint import matryoshka_sizes
from engine.prompt_cache.disk_tier import DiskTier
from engine.prompt_cache.ram_tier import MIB, PromptCache
from engine.sampling.grammar import Constraint
from engine.sampling.params import DryBreakers, SamplingParams
from engine.scheduling import slot_io
from engine.scheduling.health import Health
from engine.scheduling.request import Request, RequestEnd
from engine.scheduling.scheduler import Scheduler, SlotInfo
from engine.scheduling.task_board import Sink
from engine.slot_files import SlotFiles, lora_scales
from engine.text.image_prompts import expand, image_prompts
from engine.text.images import BadImage, ImageBudget, load_rgb, open_image, placeholder_starts
from engine.text.tokenizer import Tokenizer
from memory import CacheFull, MemoryUsage, StateMismatch


@dataclass(frozen=True)
class CacheStats:
    """``usage``: the memory's statistics, each group's ``n_blocks_held`` counting the
    blocks of the slots that run a request now."""

    usage: MemoryUsage
    n_slots: int
    n_slots_busy: int
    n_checkpoint_restores: int = 0  # prefix reuses that restarted from a kept checkpoint
    prompt_cache: dict | None = None  # PromptCache.report(); None when off
    n_pool_tokens: int = 0  # prompt tokens taken from blocks the unified pool kept by hash


@dataclass(frozen=True)
class SlotSaved:
    n_saved: int  # tokens
    n_written: int  # bytes


@dataclass(frozen=True)
class SlotRestored:
    n_restored: int  # tokens
    n_read: int  # bytes


class EngineService:
    def __init__(self, config: EngineConfig, files: SlotFiles | None = None, progress=None):
        """``progress``: see Engine (called from the loading thread)."""
        self._engine = Engine(config, progress)
        self._device = self._engine.device_report()
        self._files = files
        self._warm_up()
        self._scheduler: Scheduler | None = None

    def _warm_up(self) -> None:
        engine = self._engine
        engine.generate([[0, 1, 2, 3]], SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True))
        engine.memory.seq_rm(-1)

    def start(
        self,
        loop: asyncio.AbstractEventLoop | None,
        similarity: float = 0.1,
        max_queue: int = 256,
        stall_timeout: float = 60.0,
        on_request_end: Callable[[RequestEnd], None] | None = None,
        cache_ram_mib: int = 0,
        cache_idle_slots: bool = True,
        cache_disk: Path | None = None,
        cache_disk_mib: int = -1,
        cache_close_s: float = 10.0,
    ) -> None:
        """Start the engine thread; events go to sinks on ``loop``. ``on_request_end``
        is called on the engine thread as each request ends, before its slot is released
        (so it must be quick and thread-safe: a metrics counter). ``cache_ram_mib``: the
        host-RAM prompt cache (llama-server's ``--cache-ram``: -1 no limit, 0 off), which
        also holds at most the context's worth of tokens, as llama-server's does.
        ``cache_disk``: the directory of its disk tier (None: none), holding at most
        ``cache_disk_mib`` MiB (-1: no limit); at shutdown it gets ``cache_close_s`` seconds to
        write what the RAM tier and the idle slots hold."""
        disk = None
        if cache_disk is not None:
            engine = self._engine
            limit = None if cache_disk_mib == -1 else cache_disk_mib * MIB
            disk = DiskTier(Path(cache_disk), limit, engine.fingerprint, self.vocab_size, self.n_ctx)
            disk.lowest = self._lowest_token
        cache = PromptCache.from_mib(cache_ram_mib, limit_tokens=self._engine.config.n_ctx, disk=disk)
        cache.close_timeout = cache_close_s
        self._scheduler = Scheduler(
            self._engine, similarity, max_queue, stall_timeout, loop, on_request_end, cache, cache_idle_slots
        )
        self._scheduler.start()

    def stop(self, timeout: float | None = 30.0) -> bool:
        """See ``Scheduler.stop``; True when no engine thread is left running."""
        return self._scheduler is None or self._scheduler.stop(timeout)

    @property
    def _sched(self) -> Scheduler:
        if self._scheduler is None:
            raise RuntimeError("the engine thread was not started")
        return self._scheduler

    # ---- facts -----------------------------------------------------------------

    @property
    def tokenizer(self) -> Tokenizer:
        return self._engine.tokenizer

    @property
    def vocab_size(self) -> int:
        return self._engine.model_config.vocab_size

    @property
    def lora_labels(self) -> list[tuple[str, str]]:
        """Each loaded LoRA adapter's (task name, prompt prefix), by id ("": not given)."""
        return self._engine.lora_labels

    @instance_cache(32)
    def dry_breakers(self, texts: tuple[str, ...]) -> DryBreakers:
        """DRY's breakers: every token sequence that writes one of ``texts`` in this
        vocabulary (a scan of it, once per set: call it off the event loop)."""
        return DryBreakers(seq for text in texts for seq in self.tokenizer.breaker_sequences(text))

    @property
    def n_ctx(self) -> int:
        """Most tokens one slot may hold."""
        return self._engine.n_ctx_seq

    @property
    def hidden_size(self) -> int:
        """The length of an embedding (the model's final hidden state)."""
        return self._engine.model_config.hidden_size

    @property
    def matryoshka_dimensions(self) -> Sequence[int] | None:
        """The leading lengths an embedding may be cut to (Matryoshka models: engine/loading/pooling_hint.py)."""
        return matryoshka_sizes(self._engine.model_config.raw, self.hidden_size)

    @property
    def embedding_pooling(self) -> str | None:
        """The pooling the checkpoint names for embeddings (None: it names none)."""
        return self._engine.checkpoint_pooling

    @property
    def reranks(self) -> bool:
        """Whether the model scores query-document pairs (a decoder reranker: engine/loading/rank_head.py)."""
        return self._engine.rank_head is not None

    def rerank_prompt(self, query: str, document: str) -> str:
        """The reranker's prompt for the pair (``reranks`` must hold)."""
        return self._engine.rank_head.prompt(query, document)

    @property
    def n_slots(self) -> int:
        return self._engine.config.n_seq_max

    @property
    def context_shift(self) -> bool:
        return self._engine.config.context_shift

    @property
    def fingerprint(self) -> dict[str, str]:
        return self._engine.fingerprint

    @property
    def weight_bytes(self) -> dict[str, int]:
        """Resident weight bytes by type ("Q4_K", "Q6_K", "F32", ...), fixed at load."""
        return dict(self._engine.weight_bytes)

    def image_stats(self) -> tuple[int, float]:
        """Images encoded since start, and the seconds the encoder took (a racy read)."""
        encoder = self._engine.encoder
        return encoder.n_images_encoded, encoder.encode_seconds

    @property
    def takes_images(self) -> bool:
        return self._engine.model_config.media is not None and hasattr(self._engine.model, "encode_images")

    def media_prompt(
        self, text: str, images: list[bytes], marker: str, budget: ImageBudget | None = None, where: str = "image"
    ) -> tuple[list[int], list[MediaItem]]:
        """A rendered prompt whose images stand at ``marker`` -> (token ids, MediaItem per
        image): each marker becomes the model's image text (engine/text/images.py), the
        whole prompt is tokenized once, each image decoded and preprocessed within the
        request's ``budget``. Raises BadImage naming the image (``where`` and its index)
        and ValueError for a marker count that is not the image count. Call it off the
        event loop (it decodes images)."""
        spec = self._engine.model_config.media
        opened, decoded = [], []
        for i, data in enumerate(images):  # every header, and the budget, before any decode
            try:
                opened.append(open_image(data, budget, f"{where} {i}"))
            except BadImage as exc:
                raise BadImage(str(exc) if str(exc).startswith(where) else f"{where} {i}: {exc}") from None
        for i, image in enumerate(opened):
            try:
                decoded.append(load_rgb(image))
            except BadImage as exc:
                raise BadImage(f"{where} {i}: {exc}") from None
        layout = self._image_prompts
        expanded, frames = expand(layout, text, decoded, marker, budget, where)
        ids = self._engine.tokenizer.encode(expanded, add_special=True)
        shapes = [layout.placeholders(f) for f in frames]  # (tokens, grid) of each frame
        starts = placeholder_starts(ids, spec.image_token_id, [n for n, _ in shapes])
        return ids, [MediaItem.image(s, n, f, grid) for s, (n, grid), f in zip(starts, shapes, frames)]

    @property
    def _lowest_token(self) -> int:
        """The lowest token id a slot file or disk entry may hold: an image model's slots
        hold their images as negative keys (engine/core/media.py)."""
        return KEY_MIN if self.takes_images else 0

    @functools.cached_property
    def _image_prompts(self):
        cfg, config = self._engine.model_config, self._engine.config
        folder = config.model if config.model.is_dir() else None
        return image_prompts(cfg.model_type, folder, self._engine.tokenizer.hf, cfg.media, config.image_tokens)

    @property
    def device(self) -> dict:
        """Device, dtype, KV pool and decode mode (Engine.device_report; fixed once loaded)."""
        return self._device

    def cache_config(self) -> dict[str, str]:
        """The cache's fixed shape and where it lives, for /metrics' info series."""
        usage = self._engine.memory.usage()
        group = usage.groups[0]
        device = self._device
        return {
            "device": device["type"],
            "device_name": device["name"],
            "dtype": device["dtype"],
            "kv_bytes": str(device["kv_bytes"]),
            "decode": device["decode"],
            "block_size": str(group.block_tokens),
            "num_blocks": str(group.n_blocks_total),
            "slots": str(self.n_slots),
            "ctx_size": str(self._engine.config.n_ctx),
            "layout": self._engine.memory_config.layout,
            "memory_kind": usage.kind,
        }

    # ---- requests --------------------------------------------------------------

    def compile_constraint(self, kind: str, source: str, strict: bool = False) -> Constraint:
        """The same, in the caller's thread (a server-wide default, at start)."""
        return self._engine.grammars.compile(kind, source, strict)

    async def constraint(self, kind: str, source: str | dict | list, strict: bool = False) -> Constraint:
        """A structured-output constraint compiled and checked (in a worker thread).
        Raises RequestError naming what is wrong with it."""
        return await asyncio.to_thread(self._engine.grammars.compile, kind, source, strict)

    def validate(self, req: Request) -> None:
        """Raise RequestError for what ``submit`` would refuse whatever the load."""
        self._sched.validate(req)

    def submit(self, req: Request, sink: Sink) -> int:
        """Queue ``req``; returns its id. Raises RequestError, QueueFull, EngineStopped."""
        return self._sched.submit(req, sink)

    def cancel(self, id_task: int) -> None:
        self._sched.cancel(id_task)

    def health(self) -> Health:
        return self._sched.health()

    def lora_use(self) -> tuple[set[int], set[int]]:
        """Adapter ids in use by running requests, and by waiting ones (a racy read)."""
        return self._sched.lora_use()

    def slots(self) -> list[SlotInfo]:
        """Per-slot state (a racy read, for monitoring)."""
        return self._sched.snapshot()

    def cache_stats(self) -> CacheStats:
        """Memory statistics (a racy read, for monitoring)."""
        busy = [s.id for s in self._sched.table.slots if s.busy]
        usage = self._engine.memory.usage(held_by=busy)
        restores, pool_tokens = self._engine.n_checkpoint_restores, self._sched.board.n_pool_tokens
        return CacheStats(usage, self.n_slots, len(busy), restores, self.prompt_cache(), pool_tokens)

    def speculation(self) -> dict:
        """The speculative decoding settings (/props): type (None: off, also where the
        model's memory cannot be speculated), n_max, n_min, p_min and ngram_size or the
        draft model, and when proposals stop (more sequences decoding than
        ``max_decoding``)."""
        spec, cfg = self._engine.speculation, self._engine.config
        draft = str(cfg.model_draft) if spec.draft is not None else None
        return {
            "type": cfg.spec_type if spec.n_max else None,
            "n_max": spec.n_max,
            "n_min": spec.n_min,
            "p_min": spec.p_min if draft else None,
            "ngram_size": spec.n if not draft else None,
            "model_draft": draft,
            "step_tokens": spec.step_tokens,
            "max_decoding": spec.max_decoding,
        }

    def prompt_cache(self) -> dict | None:
        """The host-RAM prompt cache's report (a racy read), None when it is off."""
        cache = self._sched.prompt_cache
        return cache.report() if cache is not None and cache.enabled else None

    async def memory_report(self) -> dict:
        """Usage and integrity check of the memory, taken between two steps."""
        return await self._sched.call(self._engine.memory_report)

    # ---- slots and slot files ---------------------------------------------------

    def check_slot(self, id_slot: int) -> int:
        if not 0 <= id_slot < self.n_slots:
            raise SlotError(f"slot id {id_slot} out of range [0, {self.n_slots})", code="invalid_id_slot")
        return id_slot

    def files(self) -> SlotFiles:
        if self._files is None:
            raise SlotFilesOff("slot files are off: start the server with --slot-save-path")
        return self._files

    async def save_slot(self, id_slot: int, filename: str, progress=None) -> SlotSaved:
        """Snapshot the slot (busy or idle) at a step boundary, then encode and write
        the file in a worker thread (``progress(bytes done, of total)`` hears of it)."""
        files, slot = self.files(), self.check_slot(id_slot)
        sched = self._sched
        tokens, state, lora = await sched.call(lambda: slot_io.snapshot(sched.board, slot))
        fingerprint = self.fingerprint
        if "lora" in fingerprint:  # the scales its cache was computed with
            fingerprint = {**fingerprint, "lora_scales": ",".join(repr(s) for s in lora)}
        n_written = await asyncio.to_thread(files.write, filename, tokens, state, fingerprint, progress)
        return SlotSaved(len(tokens), n_written)

    async def restore_slot(self, id_slot: int, filename: str, nowait: bool = False, progress=None) -> SlotRestored:
        """Read and check the whole file in a worker thread, then load it into the idle
        slot (waiting for it unless ``nowait``). All or nothing."""
        files, slot = self.files(), self.check_slot(id_slot)
        args = (filename, self.fingerprint, self.vocab_size, self.n_ctx, progress, self._lowest_token)
        file, n_read = await asyncio.to_thread(files.read, *args)
        lora = lora_scales(file, self.fingerprint)  # checked by files.read
        sched = self._sched
        try:
            restore = lambda: slot_io.restore(sched.board, slot, file.tokens, file.state, lora)  # noqa: E731
            await sched.call(restore, slot, not nowait)
        except StateMismatch as exc:
            raise BadSlotFile(f"the file does not fit this server's cache: {exc}") from None
        except CacheFull as exc:
            raise NoRoom(f"not enough free cache to restore: {exc}") from None
        return SlotRestored(len(file.tokens), n_read)

    async def erase_slot(self, id_slot: int, nowait: bool = False) -> int:
        """Drop the idle slot's cache; returns how many tokens it held."""
        slot = self.check_slot(id_slot)
        sched = self._sched
        return await sched.call(lambda: slot_io.erase(sched.board, slot), slot, not nowait)
