"""LoRA adapters at start (llama-server's ``--lora``, ``--lora-scaled``,
``--lora-init-without-apply``): ServerSettings (server/config/settings.py) takes these fields."""

from __future__ import annotations

from pydantic import field_validator
from pydantic_settings import BaseSettings

from server.config.setting import setting


class LoraSettings(BaseSettings):
    lora: str | None = setting(
        None, description="LoRA adapters (GGUF files, PEFT folders), comma-separated, at scale 1", flags=("--lora",)
    )
    lora_scaled: str | None = setting(
        None, description="LoRA adapters with their scales, FILE:SCALE, comma-separated", flags=("--lora-scaled",)
    )
    lora_init_without_apply: bool = setting(
        False,
        description="load the adapters at scale 0 (POST /lora-adapters)",
        flags=("--lora-init-without-apply",),
        off=("--no-lora-init-without-apply",),
    )

    @field_validator("lora_scaled")
    @classmethod
    def _lora_scaled(cls, v: str | None) -> str | None:
        for item in filter(str.strip, (v or "").split(",")):
            path, _, scale = item.strip().rpartition(":")
            try:
                float(scale)
            except ValueError:
                raise ValueError(f"--lora-scaled takes FILE:SCALE, not {item.strip()!r}") from None
            if not path:
                raise ValueError(f"--lora-scaled takes FILE:SCALE, not {item.strip()!r}")
        return v

    @property
    def lora_adapters(self) -> list[tuple[str, float]]:
        """(path, scale) of each adapter, ``--lora`` ones first: the ids requests name."""
        out = [(p.strip(), 1.0) for p in (self.lora or "").split(",") if p.strip()]
        for item in (self.lora_scaled or "").split(","):
            if item.strip():
                path, _, scale = item.strip().rpartition(":")
                out.append((path, float(scale)))
        return [(p, 0.0 if self.lora_init_without_apply else s) for p, s in out]
