"""llama-server's environment variables as a settings source, below ``SLOTSERVE_*``:
each setting's variable comes from its declaration (server/config/setting.py), so a
llama-server deployment's environment configures slotserve unchanged."""

from __future__ import annotations

import os

from pydantic.fields import FieldInfo
from pydantic_settings import PydanticBaseSettingsSource

from server.config.setting import llama_env_of

_LLAMA_BOOL = {"enabled": "true", "disabled": "false"}  # llama.cpp's spellings beside true/1/on


class LlamaEnv(PydanticBaseSettingsSource):
    """Settings from llama-server's environment variables (below SLOTSERVE_* ones)."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[object, str, bool]:
        name = llama_env_of(field)
        value = os.environ.get(name) if name else None
        if value is not None and field.annotation is bool:
            value = _LLAMA_BOOL.get(value.strip().lower(), value)
        return value, field_name, False

    def __call__(self) -> dict[str, object]:
        out = {}
        for name, field in self.settings_cls.model_fields.items():
            value, _, _ = self.get_field_value(field, name)
            if value is not None:
                out[name] = value
        return out
