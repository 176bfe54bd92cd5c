"""Requests that carry several prompts (issue 37): a list of prompts on ``/completion``
is admitted as slots free up (server/pipeline/run_batch.py), so more prompts than slots
with long answers all finish, none cut for an unread buffer, and a stream starts with
the first prompt instead of after the last one's admission."""

from __future__ import annotations

import json

import httpx
import pytest
from checkpoints import make_checkpoint
from prometheus_client.parser import text_string_to_metric_families
from server_proc import InProcessServer
from waiting import wait_for

N_LONG = 1100  # more events than a run buffers for a reader that does not read (Run.MAX_BUFFERED)


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    folder = make_checkpoint(tmp_path_factory.mktemp("batches") / "llama", max_position_embeddings=2048)
    with InProcessServer(model=folder, parallel=2, ctx_size=2 * 2048, metrics=True) as s:
        yield s


def _predicted(srv) -> float:
    text = httpx.get(srv.url + "/metrics", timeout=30).text
    for family in text_string_to_metric_families(text):
        if family.name == "llamacpp:tokens_predicted":
            return sum(s.value for s in family.samples if s.name.endswith("_total"))
    raise AssertionError("llamacpp:tokens_predicted_total not in /metrics")


def _body(prompts, stream: bool) -> dict:
    return {"prompt": prompts, "n_predict": N_LONG, "ignore_eos": True, "temperature": 0, "stream": stream}


def test_more_prompts_than_slots_with_long_answers_all_finish(srv):
    prompts = ["Once upon a time", "The cat", "In a land far away"]  # 3 prompts, 2 slots
    r = httpx.post(srv.url + "/completion", json=_body(prompts, False), timeout=300)
    assert r.status_code == 200, r.text
    answers = r.json()
    assert [a["index"] for a in answers] == [0, 1, 2]
    assert all(a["tokens_predicted"] == N_LONG and a["stop_type"] == "limit" for a in answers)


def test_a_stream_of_more_prompts_than_slots_carries_every_token(srv):
    prompts = ["Once upon a time", "The cat", "In a land far away"]
    counts, stops = [0, 0, 0], []
    with httpx.stream("POST", srv.url + "/completion", json=_body(prompts, True), timeout=300) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            frame = json.loads(line[6:])
            assert "error" not in frame, frame
            counts[frame["index"]] += len(frame["tokens"])
            if frame["stop"]:
                stops.append(frame["index"])
    assert counts == [N_LONG] * 3 and sorted(stops) == [0, 1, 2]


def test_a_stream_starts_before_the_later_prompts_are_admitted(srv):
    """One slot's worth of prompts beyond the slots: the first frame comes while the
    first prompt still runs. Leaving at that frame cancels it, so fewer than its
    ``N_LONG`` tokens are ever predicted (before, the first byte came only once a
    slot had freed for the last prompt: after a whole answer)."""
    before = _predicted(srv)
    prompts = ["Once upon a time", "The cat", "In a land far away"]
    with httpx.stream("POST", srv.url + "/completion", json=_body(prompts, True), timeout=300) as r:
        assert r.status_code == 200
        first = next(line for line in r.iter_lines() if line.startswith("data: "))
    assert json.loads(first[6:])["stop"] is False
    wait_for(lambda: not any(s["is_processing"] for s in httpx.get(srv.url + "/slots").json()), what="slots idle")
    assert _predicted(srv) - before < N_LONG


def test_a_batch_stream_holds_at_most_a_window_of_events_for_a_reader_that_stops():
    """The runs' events reach the reader through a bounded queue: when the reader stops,
    the pumps stop pulling, so each run's own bound (Run.MAX_BUFFERED, then 408) applies
    instead of an unbounded merge queue growing."""
    import asyncio

    from server.pipeline.run_batch import RunBatch

    class FakeRun:
        def __init__(self):
            self.pulled = 0

        async def open(self, engine):
            return True

        async def events(self):
            for _ in range(5000):
                self.pulled += 1
                yield object()

        async def close(self):
            pass

        client_left = overflowed = False

    class FakeState:
        def require_ready(self):
            return None

    async def scenario():
        batch = RunBatch(FakeState(), [FakeRun(), FakeRun()], window=2)
        assert await batch.open_first()
        events = batch.events()
        await anext(events)  # the reader takes one event, then stops reading
        for _ in range(50):
            await asyncio.sleep(0)  # the pumps run as far as they can
        pulled = sum(run.pulled for run in batch.runs)
        await events.aclose()
        return pulled

    assert asyncio.run(scenario()) <= 2 + 2 + 1  # the queue's two, one per pump in hand, the one read
