"""What the HTTP side knows about the process: loading, ready, draining, failed."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from engine import CheckpointError, EncoderService, EngineConfig, EngineService, SlotFiles, is_encoder
from server.config.settings import ServerSettings
from server.errors import APIError
from server.telemetry.encoder_metrics import EncoderCollector
from server.telemetry.gateway_metrics import GatewayCollector
from server.telemetry.metrics import Metrics
from server.telemetry.progress import ProgressLine

log = logging.getLogger("slotserve")
MAX_FAULTS_IN_ROW = 5  # engine steps that fail one after another before /health and /ready turn 503


class ServerState:
    """Loading runs in a thread so the listener answers /health and /ready meanwhile.
    ``status``: loading -> ready -> draining; or loading -> failed."""

    def __init__(self, settings: ServerSettings):
        self.settings = settings
        self.status = "loading"
        self.error: str | None = None
        self.engine: EngineService | None = None  # set once loaded and started (None again while asleep)
        self.encoder: EncoderService | None = None  # instead, for an encoder model (embeddings, rerank)
        self.sleeping = False  # --sleep-idle-seconds: the model is freed until a request wakes it
        self.default_constraint = None  # --grammar / --json-schema, compiled once loaded
        self._lora_scales: list[float] | None = None
        self.n_inflight = 0  # HTTP requests between admission check and their last byte
        self.t_started = time.time()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.metrics = Metrics()
        self.asleep = None  # while the model sleeps: what /metrics read of it when it went to sleep
        self.metrics.bind(self.metrics_source, lambda: self.ready()[0] == 200)
        self.metrics.registry.register(  # the inference gateway's names (vllm:*) beside slotserve's
            GatewayCollector(self.metrics_source, lambda: self.settings.model_name, lambda: self.lora_names)
        )
        self.metrics.registry.register(EncoderCollector(lambda: self.encoder))
        self.slot_files = SlotFiles(settings.slot_save_path) if settings.slot_save_path is not None else None
        self._loader = threading.Thread(target=self._load, name="slotserve-loader", daemon=True)
        self._closing = threading.Event()
        self._starting = threading.Lock()  # the loader's start of the engine thread vs close()
        self.load_progress = ProgressLine(f"loading {settings.model_name}")
        self.on_failed: Callable[[], None] | None = None  # serve(): end the process (the load cannot be retried)

    def metrics_source(self):
        """What /metrics reads: the engine, or while it sleeps its snapshot (as llama-server
        serves the metrics it had on entering sleep)."""
        return self.engine if self.engine is not None else self.asleep

    def start_loading(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop  # the scheduler hands events to this loop
        self._loader.start()

    def _load(self) -> None:
        s = self.settings
        try:
            engine = self.load_engine()
        except Exception as exc:  # a bad checkpoint or setting: one clear line, then the process ends
            if s.verbose:
                log.exception("loading the model failed")
            message = str(exc) if isinstance(exc, CheckpointError) else f"{type(exc).__name__}: {exc}"
            log.error("cannot load the model: %s", message if str(s.model) in message else f"{s.model}: {message}")
            self.error, self.status = message, "failed"
            if self.on_failed is not None:
                self.on_failed()
            return
        if engine is None:  # shut down while loading
            return
        if isinstance(engine, EncoderService):
            self.metrics.describe_weights(engine.weight_bytes)
            self.status = "ready" if self.status == "loading" else self.status
            serves = (
                "reranking"
                if engine.embedding_pooling == "rank"
                else f"embeddings (pooling {engine.embedding_pooling})"
            )
            log.info("model %s ready: an encoder (%s), %d tokens an input", s.model_name, serves, engine.n_ctx)
            return
        self.metrics.describe_cache(engine.cache_config())
        self.metrics.describe_weights(engine.weight_bytes)
        if self.status == "loading":
            self.status = "ready"
        log.info("model %s ready: %d slots, context %d", s.model_name, s.parallel, engine.n_ctx)

    def load_engine(self) -> EngineService | EncoderService | None:
        """Load the model and start its engine thread (at start, and when idle sleep
        wakes it); sets ``engine`` (``encoder`` for an encoder model). None when the
        server shut down meanwhile; raises what loading raises."""
        s = self.settings
        if is_encoder(s.model):
            return self._load_encoder()
        config = EngineConfig(
            model=s.model,
            dtype=s.dtype,
            device=s.device,
            enforce_eager=s.enforce_eager,
            gpu_memory_utilization=s.gpu_memory_utilization,
            quantization=s.quantization,
            mmap=s.mmap,
            repack=s.repack,
            block_size=s.block_size,
            n_ctx=s.ctx_size,
            n_seq_max=s.parallel,
            max_batch_tokens=s.step_tokens,
            n_threads=s.threads,
            context_shift=s.context_shift,
            kv_unified=s.kv_unified,
            swa_full=s.swa_full,
            swa_checkpoints=s.ctx_checkpoints,
            ssm_checkpoints=s.ssm_checkpoints,
            ssm_checkpoint_every=s.ssm_checkpoint_every,
            kv_cache_tokens=s.kv_cache_tokens,
            chat_template=s.template_spec,
            cache_type_k=s.cache_type_k,
            cache_type_v=s.cache_type_v,
            spec_type=None if s.spec_type in (None, "none") else s.spec_type,
            model_draft=s.model_draft,
            mmproj=s.mmproj,
            image_tokens=(s.image_min_tokens, s.image_max_tokens),
            special=s.special,
            lora=tuple(path for path, _ in s.lora_adapters),
            spec_draft_max=s.spec_ngram_simple_size_m if s.model_draft is None else s.spec_draft_n_max,
            spec_draft_min=s.spec_draft_n_min,
            spec_p_min=s.spec_draft_p_min,
            spec_ngram_size=s.spec_ngram_simple_size_n,
            rerank=self.pooling == "rank",
        )
        engine = EngineService(config, self.slot_files, self.load_progress)
        if self.pooling == "rank" and not engine.reranks:
            raise CheckpointError(
                f"{s.model}: --rerank needs a reranker: a cross-encoder (BERT or XLM-RoBERTa "
                '*ForSequenceClassification, or its GGUF file) or a decoder with "yes" and "no" tokens (Qwen3-Reranker)'
            )
        if s.default_constraint is not None:  # a server-wide grammar must compile, or no engine thread starts
            kind, source = s.default_constraint
            self.default_constraint = engine.compile_constraint(kind, source)
        with self._starting:  # close() either sees this engine or stops the start
            if self._closing.is_set():  # shut down while loading: start no engine thread
                return None
            engine.start(
                self.loop,
                s.slot_prompt_similarity,
                s.max_queue,
                s.stall_timeout,
                self.metrics.request_ended,
                s.cache_ram,
                s.cache_idle_slots,
                s.cache_disk,
                s.cache_disk_size,
                s.drain_timeout,
            )
            self.engine = engine
        return engine

    def _load_encoder(self) -> EncoderService | None:
        s = self.settings
        encoder = EncoderService(s.model, self.pooling, s.threads, s.step_tokens)
        with self._starting:
            if self._closing.is_set():
                return None
            encoder.start(s.max_queue, s.stall_timeout)
            self.encoder = encoder
        return encoder

    @property
    def pooling(self) -> str | None:
        """The pooling the server's flags ask for: rank with --rerank, else --pooling."""
        return "rank" if self.settings.rerank else self.settings.pooling

    @property
    def serves_embeddings(self) -> bool:
        """--embeddings, --rerank, an encoder model (which serves nothing else), or a
        reranker's file (a decoder written to rank)."""
        s = self.settings
        reranker = self.engine is not None and self.engine.reranks and self.embedding_pooling == "rank"
        return s.embeddings or s.rerank or self.encoder is not None or reranker

    def begin_drain(self) -> None:
        self.status = "draining"

    def cut_off(self) -> None:
        """End every running and waiting request now (503 "shutting down"; streams get
        their final error event). Does not wait."""
        if self.engine is not None:
            self.engine.stop(timeout=0)
        if self.encoder is not None:
            self.encoder.stop(timeout=0)

    def close(self, timeout: float = 30.0) -> bool:
        """Stop the engine thread at a step boundary and join it. True when no thread
        of ours is left inside torch (False: a load or a step is still running)."""
        with self._starting:
            self._closing.set()
            engine = self.engine or self.encoder
        if engine is not None and not engine.stop(timeout):
            return False
        return not self._loader.is_alive()

    @property
    def embedding_pooling(self) -> str:
        """How embeddings pool: --pooling (--rerank: rank), else the checkpoint's (a reranker's
        file: rank), else ``last``."""
        model = self.engine or self.encoder
        checkpoint = model.embedding_pooling if model else None
        if checkpoint == "rank" and self.engine is not None and not self.engine.reranks:
            checkpoint = None
        return self.pooling or checkpoint or "last"

    @property
    def lora_names(self) -> list[str]:
        """Each loaded adapter's name, by id: its file's stem (a GGUF) or its folder's
        name (PEFT). A request whose ``model`` is one of them runs that adapter alone at
        scale 1 (vLLM's way, which the inference gateway routes on)."""
        return [
            Path(path).stem if str(path).endswith(".gguf") else Path(path).name
            for path, _ in self.settings.lora_adapters
        ]

    @property
    def lora_scales(self) -> list[float]:
        """The scale of each loaded adapter for requests that name none (POST /lora-adapters sets them)."""
        if self._lora_scales is None:
            self._lora_scales = [scale for _, scale in self.settings.lora_adapters]
        return self._lora_scales

    def require_ready(self) -> EngineService:
        """The engine, or a 503 that says why it cannot serve (a 501 for an encoder
        model: it generates nothing)."""
        if self.status == "ready" and self.engine is not None:
            return self.engine
        if self.status == "ready" and self.encoder is not None:
            why = f"This server does not support generation: {self.settings.model_name} is an encoder "
            raise APIError(501, why + "(it serves /v1/embeddings and /v1/rerank)", "not_supported_error")
        self._unavailable()

    def require_model(self) -> EngineService | EncoderService:
        """The loaded model whichever its kind (tokenizing, embeddings), or a 503."""
        if self.status == "ready" and self.encoder is not None:
            return self.encoder
        return self.require_ready()

    def _unavailable(self) -> NoReturn:
        if self.status == "ready":  # between sleep and wake (a route that does not wake it)
            raise APIError(503, "the model sleeps", "unavailable_error", headers={"Retry-After": "1"})
        reason = {
            "loading": "the model is loading",
            "draining": "the server is shutting down",
            "failed": f"the model failed to load: {self.error}",
        }[self.status]
        raise APIError(503, reason, "unavailable_error", headers={"Retry-After": "1"})

    def health(self) -> tuple[int, dict]:
        """Liveness, as llama-server answers it: 503 "Loading model" until the model is
        loaded (Kubernetes' startupProbe uses /ready, so no pod is restarted for it)."""
        if self.status == "loading":
            return 503, {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}
        if self.status == "failed":
            return 503, {"status": "error", "error": self.error}
        model = self.engine or self.encoder
        if model is not None:
            h = model.health()
            if not h.alive:
                return 503, {"status": "error", "error": "the engine thread has died"}
            if h.stalled:
                return 503, {"status": "error", "error": f"no step finished for {self.settings.stall_timeout} s"}
            if h.n_faults_in_row >= MAX_FAULTS_IN_ROW:
                return 503, {"status": "error", "error": f"{h.n_faults_in_row} engine steps failed in a row"}
        return 200, {"status": "ok"}

    def ready(self) -> tuple[int, dict]:
        if self.status == "loading":
            return 503, {"status": "loading", "progress": self.load_progress.state}
        if self.status != "ready":
            return 503, {"status": "error" if self.status == "failed" else self.status}
        code, body = self.health()
        return (200, {"status": "ok"}) if code == 200 else (code, body)
