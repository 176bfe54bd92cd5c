"""Router mode (issue 39, item 1): ``--models-dir`` with three tiny checkpoints and
``--models-max 2``, each model a child server started on its first request. A request's
``model`` picks the child; answers equal the model's own; streams pass through; the
least recently used model stops past the limit; an unknown model is a 404; a child
killed mid-stream fails only its own stream, and its model serves again on the next
request; /metrics joins the children's with a ``model`` label."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import httpx
import pytest
from checkpoints import make_checkpoint
from prometheus_client.parser import text_string_to_metric_families
from server_proc import ServerProcess
from waiting import wait_for

from server.router.catalog import catalog

MODELS = ("alpha", "beta", "gamma")


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("models")
    for seed, name in enumerate(MODELS):
        make_checkpoint(folder / name, "llama", seed=seed)
    return folder


@pytest.fixture(scope="module")
def router(models):
    with ServerProcess("--models-dir", str(models), "--models-max", "2", "-np", "1", "-c", "512") as srv:
        srv.wait_ready()
        yield srv


def statuses(url: str) -> dict[str, dict]:
    return {m["id"]: m["status"] for m in httpx.get(url + "/models").json()["data"]}


def complete(url: str, model: str, **extra) -> httpx.Response:
    body = {"model": model, "prompt": "The sea was", "max_tokens": 8, "temperature": 0, **extra}
    return httpx.post(url + "/v1/completions", json=body, timeout=120)


def test_each_model_answers_as_itself_and_the_least_recent_stops(router, models):
    from engine import Engine, SamplingParams

    assert set(statuses(router.url)) == set(MODELS)
    assert {s["value"] for s in statuses(router.url).values()} == {"unloaded"}
    props = httpx.get(router.url + "/props").json()
    assert props["role"] == "router" and props["max_instances"] == 2 and props["models_autoload"] is True
    answers = {}
    for name in MODELS:
        r = complete(router.url, name)
        assert r.status_code == 200, r.text
        answers[name] = r.json()["choices"][0]["text"]
    params = SamplingParams(temperature=0.0, max_tokens=8)
    for name in ("alpha", "gamma"):
        own = Engine.from_pretrained(str(models / name), n_ctx=512, n_seq_max=1).generate(["The sea was"], params)
        assert answers[name] == own[0].text
    assert len(set(answers.values())) == 3  # three models, three answers
    now = statuses(router.url)
    assert [now[n]["value"] for n in MODELS] == ["unloaded", "loaded", "loaded"]  # alpha: least recently used


def test_streams_pass_through(router):
    body = {"model": "beta", "prompt": "The sea was", "max_tokens": 8, "temperature": 0, "stream": True}
    chunks = []
    with httpx.stream("POST", router.url + "/v1/completions", json=body, timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:])["choices"][0]["text"])
    assert "".join(chunks) == complete(router.url, "beta").json()["choices"][0]["text"]


def test_unknown_and_missing_models_are_refused(router):
    r = complete(router.url, "delta")
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    r = httpx.post(router.url + "/v1/completions", json={"prompt": "x"})
    assert r.status_code == 400 and "model" in r.json()["error"]["message"]
    for route in ("/models/load", "/models/unload"):  # bodies that name no model: 400, nothing changes
        before = statuses(router.url)
        for content in (b"not json", b"[]", b'{"model": 7}'):
            r = httpx.post(router.url + route, content=content, headers={"Content-Type": "application/json"})
            assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error", r.text
        assert {n: s["value"] for n, s in statuses(router.url).items()} == {n: s["value"] for n, s in before.items()}
    assert httpx.get(router.url + "/health").status_code == 200


def stream_then(url: str, model: str, max_tokens: int, action, after: int = 3) -> list[str]:
    """The lines of a streamed completion of ``max_tokens``; ``action()`` runs once
    ``after`` lines have come."""
    body = {"model": model, "prompt": "a", "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
    got = []
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as r:
        for line in r.iter_lines():
            got.append(line)
            if len(got) == after:
                action()
    return got


def test_a_killed_child_fails_only_its_own_requests(router):
    assert complete(router.url, "gamma").status_code == 200
    pid = statuses(router.url)["gamma"]["pid"]
    got = stream_then(router.url, "gamma", 400, lambda: os.kill(pid, signal.SIGKILL))
    assert "data: [DONE]" not in got  # the stream ended with the child
    assert complete(router.url, "beta").status_code == 200  # the other model serves on
    wait_for(lambda: statuses(router.url)["gamma"]["value"] == "unloaded", 30, "gamma seen gone")
    again = complete(router.url, "gamma")  # started again
    assert again.status_code == 200 and statuses(router.url)["gamma"]["pid"] != pid


def test_a_page_on_another_site_cannot_unload(router):
    """The router's state-changing routes carry the server's cross-site refusal: a
    browser's simple POST (text/plain, a foreign Origin) is a 403 and nothing changes."""
    before = statuses(router.url)
    headers = {"Origin": "https://evil.example", "Content-Type": "text/plain"}
    r = httpx.post(router.url + "/models/unload", content='{"model": "beta"}', headers=headers)
    assert r.status_code == 403
    json_page = {"Origin": "https://evil.example"}  # JSON passes a `*` preflight: the guarded paths refuse it
    for route in ("/models/load", "/models/unload", "/models/reload"):
        assert httpx.post(router.url + route, json={"model": "beta"}, headers=json_page).status_code == 403
    assert statuses(router.url)["beta"]["value"] == before["beta"]["value"]


def test_a_path_spelled_around_the_cross_site_guard_is_refused(router):
    """The guard judges the decoded path; a ``#`` or a dot segment spelled with percent
    escapes would have become another route once the child parsed the path again
    (``/slots%23`` -> ``/slots``): such paths are a 400 at the router, and the path a
    child gets is the one judged (an escaped slash is judged as the slash it is)."""
    evil = {"Origin": "https://evil.example"}
    spelled = [("GET", "/slots%23?model=beta"), ("GET", "/v1%2F..%2Fslots?model=beta"), ("POST", "/lora-adapters%23"),
               ("POST", "/v1%2F..%2Fslots%2F0?action=erase"), ("GET", "/v1/.%2E/slots?model=beta")]  # fmt: skip
    for method, path in spelled:
        r = httpx.request(method, router.url + path, headers=evil, json={"model": "beta"} if method == "POST" else None)
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error", (path, r.text)
    r = httpx.post(router.url + "/slots%2F0?action=erase", headers=evil, json={"model": "beta"})
    assert r.status_code == 403  # judged as /slots/0
    assert httpx.get(router.url + "/slots?model=beta").status_code == 200  # plainly, from no page: served


def test_a_body_over_the_limit_is_refused_before_any_load(router):
    """The router's body gate is the model server's (--max-body-size, 8 MiB by default):
    a bigger body is a 413 at the router, read no further, and loads nothing."""
    assert httpx.post(router.url + "/models/unload", json={"model": "beta"}).status_code == 200
    body = json.dumps({"model": "beta", "prompt": "x" * (9 << 20)})
    r = httpx.post(router.url + "/v1/completions", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and "--max-body-size" in r.json()["error"]["message"]
    assert statuses(router.url)["beta"]["value"] == "unloaded"


def test_load_unload_and_metrics(router):
    assert httpx.post(router.url + "/models/unload", json={"model": "beta"}).json() == {"success": True}
    assert statuses(router.url)["beta"]["value"] == "unloaded"
    assert httpx.post(router.url + "/models/load", json={"model": "beta"}).json() == {"success": True}
    assert statuses(router.url)["beta"]["value"] == "loaded"
    text = httpx.get(router.url + "/metrics").text
    running = {
        s.labels["model"]
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "slotserve_requests_running"
    }
    assert running == {n for n, s in statuses(router.url).items() if s["value"] == "loaded"}
    own = {  # the router's own families: every model's state, also of those with no child to scrape
        (s.name, s.labels["model"], s.labels.get("state")): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name.startswith("slotserve_router_")
    }
    for name, status in statuses(router.url).items():
        assert own["slotserve_router_model_state", name, status["value"]] == 1
        assert sum(v for (n, m, _), v in own.items() if n == "slotserve_router_model_state" and m == name) == 1
    assert own["slotserve_router_model_loads_total", "beta", None] >= 2  # loaded, unloaded, loaded again
    assert own["slotserve_router_requests_in_flight", "beta", None] == 0


def test_the_catalog_reads_llama_servers_layout(tmp_path):
    """GGUF files (a split model as one), a folder with a model and its projector, a
    Hugging Face folder; the preset's flags, its [*] section and a model from elsewhere."""
    (tmp_path / "small.gguf").write_bytes(b"")
    for i in (1, 2):
        (tmp_path / f"big-0000{i}-of-00002.gguf").write_bytes(b"")
    (tmp_path / "vision").mkdir()
    (tmp_path / "vision" / "model-q8.gguf").write_bytes(b"")
    (tmp_path / "vision" / "mmproj-model-f16.gguf").write_bytes(b"")
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")
    outside = tmp_path.parent / f"{tmp_path.name}-coder.gguf"
    outside.write_bytes(b"")
    preset = tmp_path.parent / f"{tmp_path.name}-preset.ini"
    preset.write_text(f"[*]\nctx-size = 4096\n\n[small]\nflash-attn = true\n\n[coder]\nmodel = {outside}\n")
    found = catalog(tmp_path, preset)
    assert set(found) == {"small", "big", "vision", "hf", "coder"}
    assert found["big"].path.name == "big-00001-of-00002.gguf"
    assert found["vision"].mmproj.name == "mmproj-model-f16.gguf" and found["vision"].path.name == "model-q8.gguf"
    assert found["small"].args == ("--ctx-size", "4096", "--flash-attn")
    assert found["coder"].path == outside and found["hf"].args == ("--ctx-size", "4096")


def test_a_sleeping_child_and_no_child_outliving_a_killed_router(models):
    """With ``--sleep-idle-seconds`` (passed to the children), an idle model is listed
    as ``sleeping`` (llama-server's state), and a request wakes it. Then SIGKILL to the
    router (no shutdown runs): the kernel tells its children, which drain and exit."""
    with ServerProcess("--models-dir", str(models), "-np", "1", "-c", "256", "--sleep-idle-seconds", "1") as srv:
        srv.wait_ready()
        first = complete(srv.url, "alpha")
        assert first.status_code == 200
        wait_for(lambda: statuses(srv.url)["alpha"]["value"] == "sleeping", 60, "alpha asleep")
        assert httpx.get(srv.url + "/health").json()["models"]["alpha"] == "sleeping"
        again = complete(srv.url, "alpha")  # wakes it
        assert again.status_code == 200 and again.json()["choices"] == first.json()["choices"]
        pid = statuses(srv.url)["alpha"]["pid"]
        srv.stop()  # SIGKILL

    def gone() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return Path(f"/proc/{pid}/status").read_text().find("State:\tZ") >= 0  # a zombie: exited

    wait_for(gone, 60, "the child gone")


def test_the_load_queue_keeps_busy_models_and_serves_in_order(models):
    """``--models-max 1`` is a hard limit (llama-server's queue): a request for another
    model waits while the loaded one is busy, and its own request is not cut; a client
    that leaves the queue costs no model its place; requests for one model share one
    place in the line; the line is served first come, first served. The router's test
    delay (1 s on each load and request) keeps each model busy long enough to queue."""
    import socket
    import threading

    flags = ("--models-dir", str(models), "--models-max", "1", "-np", "1", "-c", "256")
    with ServerProcess(*flags, env={"SLOTSERVE_ROUTER_DEBUG_DELAY_S": "1"}) as srv:
        srv.wait_ready()
        url = srv.url
        assert httpx.post(url + "/models/load", json={"model": "alpha"}, timeout=120).json() == {"success": True}
        solo = complete(url, "alpha").json()["choices"][0]["text"]
        done: dict[str, tuple[float, httpx.Response]] = {}

        def run(key: str, model: str) -> threading.Thread:
            def go():
                r = complete(url, model)
                done[key] = (time.monotonic(), r)

            thread = threading.Thread(target=go)
            thread.start()
            return thread

        def status(model: str) -> dict:
            return statuses(url)[model]

        # a client that leaves while queued gives up its place; nothing is stopped for it
        busy = run("busy", "alpha")
        wait_for(lambda: status("alpha").get("in_flight") == 1, 60, "alpha busy")
        host, port = url.removeprefix("http://").split(":")
        leaver = socket.create_connection((host, int(port)))
        body = json.dumps({"model": "beta", "prompt": "x", "max_tokens": 1}).encode()
        leaver.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        wait_for(lambda: status("beta").get("queued") == 1, 60, "beta queued")
        leaver.close()
        wait_for(lambda: "queued" not in status("beta"), 60, "beta's place given up")
        busy.join()
        assert done["busy"][1].status_code == 200
        assert status("alpha")["value"] == "loaded" and status("beta")["value"] == "unloaded"

        # alpha busy again; beta then gamma (twice, sharing one place) wait their turns
        busy = run("busy", "alpha")
        wait_for(lambda: status("alpha").get("in_flight") == 1, 60, "alpha busy")
        waiters = [run("beta", "beta")]
        wait_for(lambda: status("beta").get("queued") == 1, 60, "beta queued")
        waiters += [run("gamma1", "gamma"), run("gamma2", "gamma")]
        wait_for(lambda: status("gamma").get("queued") == 2, 60, "gamma queued, twice in one place")
        for thread in (busy, *waiters):
            thread.join()
        assert all(r.status_code == 200 for _, r in done.values()), {k: r.text for k, (_, r) in done.items()}
        assert done["busy"][1].json()["choices"][0]["text"] == solo  # the busy model was not cut off
        assert done["beta"][0] < min(done["gamma1"][0], done["gamma2"][0])  # first come, first served
        assert {m: s["value"] for m, s in statuses(url).items()} == {
            "alpha": "unloaded",
            "beta": "unloaded",
            "gamma": "loaded",
        }

        # an unload while the model loads for a waiting request: the request loads it again
        waiter = run("again", "alpha")
        wait_for(lambda: status("alpha")["value"] == "loading" and "pid" in status("alpha"), 60, "alpha loading")
        assert httpx.post(url + "/models/unload", json={"model": "alpha"}, timeout=60).status_code == 200
        waiter.join()
        assert done["again"][1].status_code == 200 and done["again"][1].json()["choices"][0]["text"] == solo


def hub_repo(cache: Path, repo: str, files: dict[str, str]) -> Path:
    """A repository in a Hugging Face hub cache (refs/main -> its snapshot) holding ``files``."""
    folder = cache / ("models--" + repo.replace("/", "--"))
    snap = folder / "snapshots" / ("a" * 40)
    snap.mkdir(parents=True)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text("a" * 40)
    for name, text in files.items():
        (snap / name).write_text(text)
    return snap


def test_a_hub_cache_lists_as_llama_server_lists_it(tmp_path):
    """``--models-dir`` at a Hugging Face hub cache: each GGUF model file is
    ``OWNER/NAME:TAG`` (a split model once, projectors with their models, draft heads
    and untagged files left out), a Hugging Face snapshot is ``OWNER/NAME``; a preset's
    ``hf-repo`` picks from the cache (Q4_K_M first when no tag is given), and
    ``dedup-cache-models`` hides the cache entry it uses."""
    from server.router.hub_cache import resolve

    cache = tmp_path / "hub"
    snap = hub_repo(
        cache,
        "org/tiny-GGUF",
        {
            "tiny-Q8_0.gguf": "",
            "tiny-Q4_K_M.gguf": "",
            "tiny-Q2_K-00001-of-00002.gguf": "",
            "tiny-Q2_K-00002-of-00002.gguf": "",
            "mmproj-tiny-F16.gguf": "",
            "mtp-tiny-Q8_0.gguf": "",
            "untagged.gguf": "",
        },
    )
    hf = hub_repo(cache, "org/tiny-hf", {"config.json": "{}", "model.safetensors": ""})
    found = catalog(cache, None)
    assert set(found) == {"org/tiny-GGUF:Q8_0", "org/tiny-GGUF:Q4_K_M", "org/tiny-GGUF:Q2_K", "org/tiny-hf"}
    assert found["org/tiny-GGUF:Q2_K"].path == snap / "tiny-Q2_K-00001-of-00002.gguf"
    assert found["org/tiny-GGUF:Q8_0"].mmproj == snap / "mmproj-tiny-F16.gguf"
    assert found["org/tiny-hf"].path == hf
    assert resolve("org/tiny-GGUF", cache).path.name == "tiny-Q4_K_M.gguf"
    assert resolve("org/tiny-GGUF:q8_0", cache).path.name == "tiny-Q8_0.gguf"
    assert resolve("org/absent", cache) is None
    preset = tmp_path / "preset.ini"
    preset.write_text("[*]\nctx-size = 512\n\n[mine]\nhf-repo = org/tiny-GGUF:Q8_0\ndedup-cache-models = true\n")
    found = catalog(cache, preset)
    assert found["mine"].path == snap / "tiny-Q8_0.gguf" and found["mine"].args == ("--ctx-size", "512")
    assert found["org/tiny-GGUF:Q8_0"].hidden and not found["org/tiny-GGUF:Q4_K_M"].hidden
    preset.write_text("[mine]\nhf-repo = org/absent\n")
    with pytest.raises(ValueError, match="not in the hub cache"):
        catalog(cache, preset)


def test_models_reload_reads_the_preset_again(models, tmp_path):
    """A model that cannot load answers its load error (503) and the router serves on.
    ``POST /models/reload`` (not a GET: ``?reload=1`` is a 405): a model gone from the preset is gone, a new one is
    listed, an unchanged one stays; a preset that no longer parses is a 400 and the
    list stays as it was."""
    preset = tmp_path / "preset.ini"
    broken = tmp_path / "broken"  # a model whose server cannot load it
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "llama"}')
    preset.write_text(
        f"[one]\nmodel = {models / 'alpha'}\n\n[two]\nmodel = {models / 'beta'}\n\n[broken]\nmodel = {broken}\n"
    )
    with ServerProcess("--models-preset", str(preset), "-np", "1", "-c", "256") as srv:
        srv.wait_ready()
        assert set(statuses(srv.url)) == {"one", "two", "broken"}
        r = complete(srv.url, "broken")  # its load error; the router stays up and serves the others
        assert r.status_code == 503 and "failed to load" in r.json()["error"]["message"], r.text
        assert statuses(srv.url)["broken"]["value"] == "failed" and statuses(srv.url)["broken"]["failed"] is True
        assert complete(srv.url, "one").status_code == 200
        preset.write_text(f"[two]\nmodel = {models / 'beta'}\n\n[three]\nmodel = {models / 'gamma'}\n")
        assert set(statuses(srv.url)) == {"one", "two", "broken"}  # read again only when asked
        r = httpx.get(srv.url + "/models?reload=1")  # no GET changes state
        assert r.status_code == 405 and "POST /models/reload" in r.json()["error"]["message"]
        assert set(statuses(srv.url)) == {"one", "two", "broken"}
        listed = httpx.post(srv.url + "/models/reload").json()["data"]
        assert {m["id"] for m in listed} == {"two", "three"}
        preset.write_text("[broken\n")
        r = httpx.post(srv.url + "/models/reload")
        assert r.status_code == 400 and "models-preset" in r.json()["error"]["message"]
        assert set(statuses(srv.url)) == {"two", "three"}


def test_a_model_kept_busy_cannot_starve_a_queued_one(models):
    """Three clients, out of step, keep alpha busy without a pause (``--models-max 1``): beta's request
    still gets its turn once it has waited the queue's patience — alpha is reserved,
    takes no new request, finishes those it has and stops — and every alpha request
    is answered in full (those that came meanwhile wait for alpha to load again)."""
    import threading

    from server.router.children import PATIENCE_S

    flags = ("--models-dir", str(models), "--models-max", "1", "-np", "1", "-c", "256")
    with ServerProcess(*flags, env={"SLOTSERVE_ROUTER_DEBUG_DELAY_S": "1"}) as srv:
        srv.wait_ready()
        solo = complete(srv.url, "alpha").json()["choices"][0]["text"]
        beta_done, answers = threading.Event(), []
        deadline = time.monotonic() + PATIENCE_S + 25

        def keep_busy(offset: float):
            time.sleep(offset)  # out of step with the others: one is always in flight
            while not beta_done.is_set() and time.monotonic() < deadline:
                answers.append(complete(srv.url, "alpha"))

        clients = [threading.Thread(target=keep_busy, args=(offset,)) for offset in (0.0, 0.35, 0.7)]
        for c in clients:
            c.start()
        wait_for(lambda: statuses(srv.url)["alpha"].get("in_flight", 0) >= 1, 60, "alpha busy")
        beta = complete(srv.url, "beta")
        served_while_busy = time.monotonic() < deadline  # not only once the clients gave up
        beta_done.set()
        for c in clients:
            c.join()
        assert beta.status_code == 200 and served_while_busy, beta.text
        assert answers and all(r.status_code == 200 and r.json()["choices"][0]["text"] == solo for r in answers)


def test_a_client_that_leaves_cancels_the_request_in_the_child(router):
    """The router closes the child's stream when its client leaves: the child stops
    generating (its token counter stays far below what the request asked for)."""
    from server_proc import metric

    assert complete(router.url, "beta").status_code == 200
    before = metric(router.url, "slotserve_generation_tokens_total", model="beta")
    body = {"model": "beta", "prompt": "a", "max_tokens": 480, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", router.url + "/v1/completions", json=body, timeout=120) as r:
        lines = r.iter_lines()
        for _ in range(3):
            next(lines)
    # the connection is closed here, a few tokens in
    wait_for(
        lambda: (
            metric(router.url, "slotserve_requests_running", model="beta") == 0
            and statuses(router.url)["beta"].get("in_flight") == 0
        ),
        60,
        "the request gone from the child",
    )
    generated = metric(router.url, "slotserve_generation_tokens_total", model="beta") - before
    assert generated < 400, generated


def test_sigterm_drains_the_router_and_its_children(models):
    """SIGTERM to the router: a stream in flight still ends with ``[DONE]`` and every
    token, then the children and the router exit."""
    with ServerProcess("--models-dir", str(models), "-np", "1", "-c", "512") as srv:
        srv.wait_ready()
        assert complete(srv.url, "alpha").status_code == 200
        pid = statuses(srv.url)["alpha"]["pid"]
        body = {"model": "alpha", "prompt": "a", "max_tokens": 64, "ignore_eos": True, "stream": True}
        texts, lines = [], []
        with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=120) as r:
            for line in r.iter_lines():
                lines.append(line)
                if line.startswith("data: {"):
                    texts.append(json.loads(line[6:])["choices"][0]["text"])
                if len(texts) == 1:
                    srv.signal(signal.SIGTERM)
        assert lines[-1] == "data: [DONE]" or "data: [DONE]" in lines
        assert len(texts) >= 64  # every token (a last chunk may carry only the finish reason)
        assert srv.proc.wait(60) == 0
        wait_for(lambda: not Path(f"/proc/{pid}").exists() or "State:\tZ" in Path(f"/proc/{pid}/status").read_text(),
                 30, "the child gone")  # fmt: skip
