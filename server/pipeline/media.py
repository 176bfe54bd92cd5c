"""A chat request's images: their bytes out of ``data:`` URLs, and the prompt with
them (engine.media_prompt, off the event loop). Bad media is a 400 that names the part;
nothing reaches the scheduler."""

from __future__ import annotations

import asyncio
import base64
import binascii

from engine import BadImage, EngineService
from server.errors import APIError
from server.pipeline.outbound import fetch
from server.schemas.fields import text_only
from server.schemas.requests import MEDIA_MARKER

MAX_IMAGE_BYTES = 20 * 2**20  # one image's encoded size
MAX_IMAGES = 16  # in one request
FETCH_S = 30.0  # an image URL's whole fetch


async def image_bytes(url: str, where: str, settings) -> bytes:
    """The bytes of a ``data:[<type>];base64,<data>`` URL, or of an http(s) URL fetched
    under server/pipeline/outbound.py's rules when ``--media-urls`` is on; a 400 else."""
    if url.startswith(("http://", "https://")) and settings.media_urls:
        who = f"{where}: the image fetch"
        return await fetch(url, settings.media_urls_private, who, "--media-urls-private", MAX_IMAGE_BYTES, FETCH_S)
    if not url.startswith("data:"):
        raise APIError(
            400, f"{where}: only data: URLs are taken (base64 image bytes); start with --media-urls to fetch"
        )
    head, _, data = url.partition(",")
    if not head.endswith(";base64"):
        raise APIError(400, f"{where}: a data: URL of an image must be base64 (';base64,')")
    if len(data) > MAX_IMAGE_BYTES * 4 // 3 + 4:
        raise APIError(400, f"{where}: the image is larger than {MAX_IMAGE_BYTES // 2**20} MiB")
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise APIError(400, f"{where}: the data: URL is not valid base64") from None


async def media_prompt(
    engine: EngineService, prompt: str, urls: list[str | None], where: str, settings
) -> tuple[list, list]:
    """The prompt's token ids and its images (MediaItem), each image where the prompt
    holds a marker; ``urls``: one per image (None: a part without one). A model without
    an image encoder: llama-server's 400, naming ``where`` the first image came."""
    if not engine.takes_images:
        raise APIError(400, f"{where}: {text_only('image')}")
    if len(urls) > MAX_IMAGES:
        raise APIError(400, f"at most {MAX_IMAGES} images a request, got {len(urls)}")
    images = []
    for i, url in enumerate(urls):
        if url is None:
            raise APIError(400, f"{where}: image {i} has no image_url.url")
        images.append(await image_bytes(url, f"image {i}", settings))
    try:
        return await asyncio.to_thread(engine.media_prompt, prompt, images, MEDIA_MARKER)
    except (BadImage, ValueError) as exc:
        raise APIError(400, str(exc)) from None
