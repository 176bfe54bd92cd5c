"""Server-wide sampling defaults under llama-server's flag names (``--temp``,
``--samplers``, ``--dry-multiplier``, ``--mirostat``, ...): what a request that sets a
field leaves to the server. ServerSettings (server/config/settings.py) takes these fields."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings

SAMPLER_FLAGS: dict[str, tuple[str, ...]] = {
    "temp": ("--temp",),
    "top_k": ("--top-k",),
    "top_p": ("--top-p",),
    "min_p": ("--min-p",),
    "seed": ("-s", "--seed"),
    "samplers": ("--samplers",),
    "sampling_seq": ("--sampling-seq", "--sampler-seq"),
    "typical": ("--typical", "--typical-p"),
    "top_nsigma": ("--top-nsigma", "--top-n-sigma"),
    "xtc_probability": ("--xtc-probability",),
    "xtc_threshold": ("--xtc-threshold",),
    "dynatemp_range": ("--dynatemp-range",),
    "dynatemp_exp": ("--dynatemp-exp",),
    "mirostat": ("--mirostat",),
    "mirostat_lr": ("--mirostat-lr",),
    "mirostat_ent": ("--mirostat-ent",),
    "dry_multiplier": ("--dry-multiplier",),
    "dry_base": ("--dry-base",),
    "dry_allowed_length": ("--dry-allowed-length",),
    "dry_penalty_last_n": ("--dry-penalty-last-n",),
    "dry_sequence_breaker": ("--dry-sequence-breaker",),
    "repeat_last_n": ("--repeat-last-n",),
    "repeat_penalty": ("--repeat-penalty",),
    "presence_penalty": ("--presence-penalty",),
    "frequency_penalty": ("--frequency-penalty",),
    "min_keep": ("--min-keep",),
}
_REQUEST_NAMES = {  # setting -> the request field it is the default of
    "temp": "temperature",
    "typical": "typical_p",
    "top_nsigma": "top_n_sigma",
    "dynatemp_exp": "dynatemp_exponent",
    "mirostat_lr": "mirostat_eta",
    "mirostat_ent": "mirostat_tau",
}


class SamplerSettings(BaseSettings):
    temp: float | None = Field(None, ge=0, description="default temperature of requests that set none")
    top_k: int | None = Field(None, ge=0, description="default top-k of requests that set none")
    top_p: float | None = Field(None, gt=0, le=1, description="default top-p of requests that set none")
    min_p: float | None = Field(None, ge=0, le=1, description="default min-p of requests that set none")
    seed: int | None = Field(None, description="default sampling seed of requests that set none (-1: random)")
    samplers: str | None = Field(None, description="the sampler chain's order, names separated by ';'")
    sampling_seq: str | None = Field(None, description="the same as llama.cpp's letters (e.g. edskypmxt)")
    typical: float | None = Field(None, ge=0, le=1, description="locally typical sampling p (1: off)")
    top_nsigma: float | None = Field(None, description="keep logits within n std of the top one (<= 0: off)")
    xtc_probability: float | None = Field(None, ge=0, le=1, description="XTC: chance a step removes top choices")
    xtc_threshold: float | None = Field(None, ge=0, le=1, description="XTC: ... those at least this likely")
    dynatemp_range: float | None = Field(None, ge=0, description="dynamic temperature range (0: off)")
    dynatemp_exp: float | None = Field(None, ge=0, description="dynamic temperature exponent")
    mirostat: int | None = Field(None, ge=0, le=2, description="mirostat version (0: off)")
    mirostat_lr: float | None = Field(None, ge=0, le=1, description="mirostat learning rate (eta)")
    mirostat_ent: float | None = Field(None, ge=0, description="mirostat target entropy (tau)")
    dry_multiplier: float | None = Field(None, ge=0, description="DRY penalty multiplier (0: off)")
    dry_base: float | None = Field(None, ge=1, description="DRY penalty base")
    dry_allowed_length: int | None = Field(None, ge=0, description="DRY: repeats longer than this are penalized")
    dry_penalty_last_n: int | None = Field(None, ge=-1, description="DRY: tokens scanned (-1: all, 0: off)")
    dry_sequence_breaker: str | None = Field(None, description="DRY's one sequence breaker ('none': none)")
    repeat_last_n: int | None = Field(None, ge=-1, description="penalties count the last n tokens (0: off)")
    repeat_penalty: float | None = Field(None, gt=0, description="default repetition penalty")
    presence_penalty: float | None = Field(None, ge=-2, le=2, description="default presence penalty")
    frequency_penalty: float | None = Field(None, ge=-2, le=2, description="default frequency penalty")
    min_keep: int | None = Field(None, ge=0, description="truncating samplers keep at least this many tokens")

    @property
    def sampling_defaults(self) -> dict:
        """The server-wide defaults that override a route's own (only those set), under
        the request's field names."""
        out = {}
        for name in SAMPLER_FLAGS:
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
