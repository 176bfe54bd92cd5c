"""Server-wide sampling defaults under llama-server's flag names (``--temp``,
``--samplers``, ``--dry-multiplier``, ``--mirostat``, ...): what a request that sets a
field leaves to the server. ServerSettings (server/config/settings.py) takes these fields."""

from __future__ import annotations

from pydantic_settings import BaseSettings

from server.config.setting import setting

_REQUEST_NAMES = {  # setting -> the request field it is the default of
    "temp": "temperature",
    "typical": "typical_p",
    "top_nsigma": "top_n_sigma",
    "dynatemp_exp": "dynatemp_exponent",
    "mirostat_lr": "mirostat_eta",
    "mirostat_ent": "mirostat_tau",
}


class SamplerSettings(BaseSettings):
    temp: float | None = setting(
        None,
        ge=0,
        description="default temperature of requests that set none",
        flags=("--temp",),
        llama_env="LLAMA_ARG_TEMPERATURE",
    )
    top_k: int | None = setting(
        None,
        ge=0,
        description="default top-k of requests that set none",
        flags=("--top-k",),
        llama_env="LLAMA_ARG_TOP_K",
    )
    top_p: float | None = setting(
        None,
        gt=0,
        le=1,
        description="default top-p of requests that set none",
        flags=("--top-p",),
        llama_env="LLAMA_ARG_TOP_P",
    )
    min_p: float | None = setting(
        None,
        ge=0,
        le=1,
        description="default min-p of requests that set none",
        flags=("--min-p",),
        llama_env="LLAMA_ARG_MIN_P",
    )
    seed: int | None = setting(
        None, description="default sampling seed of requests that set none (-1: random)", flags=("-s", "--seed")
    )
    samplers: str | None = setting(
        None, description="the sampler chain's order, names separated by ';'", flags=("--samplers",)
    )
    sampling_seq: str | None = setting(
        None, description="the same as llama.cpp's letters (e.g. edskypmxt)", flags=("--sampling-seq", "--sampler-seq")
    )
    typical: float | None = setting(
        None, ge=0, le=1, description="locally typical sampling p (1: off)", flags=("--typical", "--typical-p")
    )
    top_nsigma: float | None = setting(
        None, description="keep logits within n std of the top one (<= 0: off)", flags=("--top-nsigma", "--top-n-sigma")
    )
    xtc_probability: float | None = setting(
        None, ge=0, le=1, description="XTC: chance a step removes top choices", flags=("--xtc-probability",)
    )
    xtc_threshold: float | None = setting(
        None, ge=0, le=1, description="XTC: ... those at least this likely", flags=("--xtc-threshold",)
    )
    dynatemp_range: float | None = setting(
        None, ge=0, description="dynamic temperature range (0: off)", flags=("--dynatemp-range",)
    )
    dynatemp_exp: float | None = setting(
        None, ge=0, description="dynamic temperature exponent", flags=("--dynatemp-exp",)
    )
    mirostat: int | None = setting(None, ge=0, le=2, description="mirostat version (0: off)", flags=("--mirostat",))
    mirostat_lr: float | None = setting(
        None, ge=0, le=1, description="mirostat learning rate (eta)", flags=("--mirostat-lr",)
    )
    mirostat_ent: float | None = setting(
        None, ge=0, description="mirostat target entropy (tau)", flags=("--mirostat-ent",)
    )
    dry_multiplier: float | None = setting(
        None, ge=0, description="DRY penalty multiplier (0: off)", flags=("--dry-multiplier",)
    )
    dry_base: float | None = setting(None, ge=1, description="DRY penalty base", flags=("--dry-base",))
    dry_allowed_length: int | None = setting(
        None, ge=0, description="DRY: repeats longer than this are penalized", flags=("--dry-allowed-length",)
    )
    dry_penalty_last_n: int | None = setting(
        None, ge=-1, description="DRY: tokens scanned (-1: all, 0: off)", flags=("--dry-penalty-last-n",)
    )
    dry_sequence_breaker: str | None = setting(
        None, description="DRY's one sequence breaker ('none': none)", flags=("--dry-sequence-breaker",)
    )
    repeat_last_n: int | None = setting(
        None, ge=-1, description="penalties count the last n tokens (0: off)", flags=("--repeat-last-n",)
    )
    repeat_penalty: float | None = setting(
        None, gt=0, description="default repetition penalty", flags=("--repeat-penalty",)
    )
    presence_penalty: float | None = setting(
        None, ge=-2, le=2, description="default presence penalty", flags=("--presence-penalty",)
    )
    frequency_penalty: float | None = setting(
        None, ge=-2, le=2, description="default frequency penalty", flags=("--frequency-penalty",)
    )
    min_keep: int | None = setting(
        None, ge=0, description="truncating samplers keep at least this many tokens", flags=("--min-keep",)
    )

    @property
    def sampling_defaults(self) -> dict:
        """The server-wide defaults that override a route's own (only those set), under
        the request's field names."""
        out = {}
        for name in SamplerSettings.model_fields:
            value = getattr(self, name)
            if value is not None and name not in ("samplers", "sampling_seq", "dry_sequence_breaker"):
                out[_REQUEST_NAMES.get(name, name)] = value
        if self.samplers is not None:
            out["samplers"] = [s for s in self.samplers.split(";") if s]
        elif self.sampling_seq is not None:
            out["samplers"] = self.sampling_seq
        if self.dry_sequence_breaker is not None:
            out["dry_sequence_breakers"] = [] if self.dry_sequence_breaker == "none" else [self.dry_sequence_breaker]
        return out
