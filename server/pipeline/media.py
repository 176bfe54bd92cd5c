"""A request's images: their bytes out of ``data:`` URLs (or fetched), and the prompt
with them (engine.media_prompt, off the event loop). One ImageBudget per request, across
all its prompts and on every route: at most MAX_IMAGES images, and one byte budget for
their files, decoded pixels and tensors, each taken before the work (engine/text/images.py),
and the process's frames of all pending requests together (a 503 past them).
Bad media, or media over the budget, is a 400 that names the part; nothing reaches the
scheduler."""

from __future__ import annotations

import asyncio
import base64
import binascii

from engine import MAX_IMAGES, BadImage, EngineService, ImageBudget, ImagesBusy
from server.errors import APIError
from server.pipeline.outbound import fetch
from server.schemas.fields import text_only
from server.schemas.requests import MEDIA_MARKER

MAX_IMAGE_BYTES = 20 * 2**20  # one image's encoded size
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
    engine: EngineService, prompt: str, urls: list[str | None], where: str, settings, budget: ImageBudget
) -> tuple[list, list]:
    """The prompt's token ids and its images (MediaItem), each image where the prompt
    holds a marker; ``urls``: one per image (None: a part without one); ``budget``: the
    request's, shared by all its prompts. A model without an image encoder: llama-server's
    400, naming ``where`` the first image came."""
    if not engine.takes_images:
        raise APIError(400, f"{where}: {text_only('image')}")
    try:
        budget.count(len(urls), f"{where}: {len(urls)} images")
        images = []
        for i, url in enumerate(urls):
            if url is None:
                raise APIError(400, f"{where}: image {i} has no image_url.url")
            data = await image_bytes(url, f"{where}: image {i}", settings)
            budget.take(len(data), f"{where}: image {i}", "its file")
            images.append(data)
        return await asyncio.to_thread(engine.media_prompt, prompt, images, MEDIA_MARKER, budget, f"{where}: image")
    except ImagesBusy as exc:  # the process's frames for pending requests: not this request's fault
        raise APIError(503, str(exc), "unavailable_error", headers={"Retry-After": "1"}) from None
    except (BadImage, ValueError) as exc:
        raise APIError(400, str(exc)) from None


__all__ = ["MAX_IMAGES", "ImageBudget", "media_prompt", "image_bytes"]
