"""An encoder model's job for one HTTP request (embeddings, rerank): awaited while the
client is there, cancelled when it leaves, its refusals as HTTP statuses."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from fastapi import Request as HTTPRequest

from engine import QueueFull, StepFailed
from server.errors import APIError
from server.pipeline.run import wait_disconnect
from server.state import ServerState

T = TypeVar("T")


async def encoder_call(state: ServerState, http: HTTPRequest, work: Awaitable[T]) -> T | None:
    """``work``'s result; None when the client left first (its job is dropped). Raises
    APIError: 503 when the queue is full, 500 when the encoder failed."""
    job = asyncio.ensure_future(work)
    watch = asyncio.create_task(wait_disconnect(http))
    state.n_inflight += 1  # a drain waits for it
    try:
        done, _ = await asyncio.wait({job, watch}, return_when=asyncio.FIRST_COMPLETED)
        return job.result() if job in done else None
    except QueueFull as exc:
        raise APIError(503, str(exc), "unavailable_error", headers={"Retry-After": "1"}) from exc
    except StepFailed as exc:
        raise APIError(500, f"the encoder failed: {exc}", "server_error") from exc
    finally:
        state.n_inflight -= 1
        watch.cancel()
        if not job.done():
            job.cancel()
