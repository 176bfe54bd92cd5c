"""Images (llama-server's ``-mm/--mmproj``, ``--image-min-tokens``, ``--image-max-tokens``;
slotserve's ``--media-urls``): ServerSettings (server/config/settings.py) takes these fields."""

from __future__ import annotations

from pathlib import Path

from pydantic_settings import BaseSettings

from server.config.setting import setting


class MediaSettings(BaseSettings):
    mmproj: Path | None = setting(
        None,
        description="a GGUF model's multimodal projector (convert_hf_to_gguf.py --mmproj): images in prompts",
        flags=("-mm", "--mmproj"),
        llama_env="LLAMA_ARG_MMPROJ",
    )
    mmproj_offload: bool = setting(
        True,
        description="accepted for llama.cpp compatibility: the projector runs where the model does",
        flags=("--mmproj-offload",),
        off=("--no-mmproj-offload",),
        llama_env="LLAMA_ARG_MMPROJ_OFFLOAD",
    )
    image_min_tokens: int | None = setting(
        None,
        ge=1,
        description="fewest tokens an image takes, for models whose image size varies (Qwen2.5-VL)",
        flags=("--image-min-tokens",),
        llama_env="LLAMA_ARG_IMAGE_MIN_TOKENS",
    )
    image_max_tokens: int | None = setting(
        None,
        ge=1,
        description="most tokens an image takes, for models whose image size varies (Qwen2.5-VL)",
        flags=("--image-max-tokens",),
        llama_env="LLAMA_ARG_IMAGE_MAX_TOKENS",
    )
    media_urls: bool = setting(
        False,
        description="fetch http(s) image URLs of requests (public addresses; 20 MiB, 30 s each); off: data: URLs only",
        flags=("--media-urls",),
        off=("--no-media-urls",),
    )
    media_urls_private: bool = setting(
        False,
        description="let image URLs reach loopback, link-local and private addresses (a media server on the LAN)",
        flags=("--media-urls-private",),
        off=("--no-media-urls-private",),
    )
