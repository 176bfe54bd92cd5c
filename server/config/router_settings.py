"""Router mode (llama-server's ``--models-dir``, ``--models-preset``, ``--models-max``,
``--models-autoload``): ServerSettings (server/config/settings.py) takes these fields.
With ``--models-dir`` the process serves no model itself: it routes each request by its
``model`` to a child server per model (server/router/)."""

from __future__ import annotations

from pathlib import Path

from pydantic_settings import BaseSettings

from server.config.setting import setting


class RouterSettings(BaseSettings):
    models_dir: Path | None = setting(
        None,
        description="router mode: serve the models in this folder (GGUF files, GGUF + mmproj pairs in a "
        "folder, Hugging Face folders), each in a child server started on its first request",
        flags=("--models-dir",),
        router=True,
        llama_env="LLAMA_ARG_MODELS_DIR",
    )
    models_preset: Path | None = setting(
        None,
        description="router mode: per-model flags, an ini file of [model-name] sections of flag = value",
        flags=("--models-preset",),
        router=True,
        llama_env="LLAMA_ARG_MODELS_PRESET",
    )
    models_max: int = setting(
        4,
        ge=0,
        description="router mode: most models loaded at once; the least recently used stops past it (0: no limit)",
        flags=("--models-max",),
        router=True,
        llama_env="LLAMA_ARG_MODELS_MAX",
    )
    models_autoload: bool = setting(
        True,
        description="router mode: a request for a model that is not loaded loads it",
        flags=("--models-autoload",),
        router=True,
        off=("--no-models-autoload",),
        llama_env="LLAMA_ARG_MODELS_AUTOLOAD",
    )
