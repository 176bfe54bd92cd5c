"""Router mode's defects of issue 50, each with the real processes, sockets and files it
was found with: a router configured by environment, children on private sockets with
their own keys, preset keys the router keeps, one CORS header, a crash or a failed
spawn while loading, a reload under queued requests, stops that keep --drain-timeout,
llama-server's /props?model= and /slots?model=, --api-prefix and several --host."""

from __future__ import annotations

import logging
import os
import signal
import stat
from pathlib import Path

import httpx
import pytest
from checkpoints import make_checkpoint
from server_proc import ServerProcess, metric
from test_router import stream_then
from waiting import wait_for

from server.router.catalog import catalog
from server.router.lifecycle import TRANSITIONS, InvalidTransition, Lifecycle

KEY = "router-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("models")
    for seed, name in enumerate(("alpha", "beta")):
        make_checkpoint(folder / name, "llama", seed=seed)
    return folder


def children_of(pid: int) -> list[int]:
    """The live processes whose parent is ``pid``."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                out.append(int(entry.name))
    return out


def cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]


def environ(pid: int) -> dict[str, str]:
    items = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0")
    return dict(item.split("=", 1) for item in items if "=" in item)


def statuses(url: str, headers: dict | None = None) -> dict[str, dict]:
    return {m["id"]: m["status"] for m in httpx.get(url + "/models", headers=headers).json()["data"]}


def complete(url: str, model: str, headers: dict | None = None, **extra) -> httpx.Response:
    body = {"model": model, "prompt": "The sea was", "max_tokens": 4, "temperature": 0, **extra}
    return httpx.post(url + "/v1/completions", json=body, headers=headers, timeout=120)


def test_a_router_configured_by_environment_starts_model_servers(models):
    """``SLOTSERVE_MODELS_DIR`` / ``LLAMA_ARG_MODELS_DIR`` (no flag): the child started
    for a model serves that model (it once started as a router in turn, forking
    without end). Its environment has none of the router's settings, and its key."""
    env = {"LLAMA_ARG_MODELS_DIR": str(models), "SLOTSERVE_MODELS_MAX": "1", "LLAMA_API_KEY": KEY}
    with ServerProcess("-np", "1", "-c", "256", env=env) as srv:
        srv.wait_ready()
        assert httpx.get(srv.url + "/props", headers=AUTH).json()["role"] == "router"
        r = complete(srv.url, "alpha", AUTH)
        assert r.status_code == 200, r.text
        (child,) = children_of(srv.proc.pid)
        assert children_of(child) == []  # a model server, not another router
        argv = cmdline(child)
        assert argv[argv.index("serve") + 1 :][:2] == ["-m", str(models / "alpha")]
        own = environ(child)
        assert not {"LLAMA_ARG_MODELS_DIR", "SLOTSERVE_MODELS_MAX", "LLAMA_API_KEY"} & set(own)
        assert own["SLOTSERVE_API_KEY"] not in (KEY, "") and own["SLOTSERVE_API_KEY"] not in " ".join(argv)


def test_a_child_given_a_model_never_routes(models, tmp_path):
    """The command line a child gets, with the router's variables set around it: it
    serves its model (``-m`` wins), as llama-server does."""
    env = {"SLOTSERVE_MODELS_DIR": str(models)}
    with ServerProcess("-m", str(models / "beta"), "-np", "1", "-c", "256", env=env) as srv:
        srv.wait_ready()
        props = httpx.get(srv.url + "/props").json()
        assert props.get("role") != "router" and "default_generation_settings" in props


@pytest.fixture(scope="module")
def keyed(models, tmp_path_factory):
    """A router with an API key, a preset that tries to set router keys, and a preset
    model whose server hangs while loading (its config.json is a FIFO nobody writes)."""
    folder = tmp_path_factory.mktemp("keyed")
    hang = folder / "hang"
    hang.mkdir()
    os.mkfifo(hang / "config.json")
    preset = folder / "preset.ini"
    preset.write_text(
        f"[alpha]\nmodel = {models / 'alpha'}\nhost = 0.0.0.0\nport = 9\nalias = other\napi-key = open\n"
        f"models-max = 9\n\n[beta]\nmodel = {models / 'beta'}\n\n[hang]\nmodel = {hang}\n"
    )
    log = folder / "router.log"
    flags = ("--models-preset", str(preset), "--api-key", KEY, "-np", "1", "-c", "256", "--metrics")
    with ServerProcess(*flags, "--cors-origins", "https://app.example", log=log) as srv:
        srv.wait_ready()
        srv.log = log
        yield srv


def test_children_listen_on_private_sockets_with_their_own_key(keyed):
    """A child is reached over a UNIX socket it binds itself, in a folder only the
    router's user can enter, and answers only with its own secret key (not the
    router's, not none); preset keys the router owns are dropped (each with a log line)."""
    r = complete(keyed.url, "alpha", AUTH)
    assert r.status_code == 200 and r.json()["model"] == "alpha", r.text
    assert complete(keyed.url, "alpha").status_code == 401  # the router's key still guards the router
    pid = statuses(keyed.url, AUTH)["alpha"]["pid"]
    argv = cmdline(pid)
    assert "--port" not in argv and "--api-key" not in argv and "0.0.0.0" not in argv and "other" not in argv
    path = Path(argv[argv.index("--host") + 1])
    assert path.suffix == ".sock" and stat.S_ISSOCK(path.stat().st_mode)
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700 and path.parent.stat().st_uid == os.getuid()
    transport = httpx.HTTPTransport(uds=str(path))
    with httpx.Client(transport=transport, base_url="http://child") as child:
        assert child.get("/slots").status_code == 401
        assert child.get("/slots", headers=AUTH).status_code == 401
        secret = environ(pid)["SLOTSERVE_API_KEY"]
        assert child.get("/slots", headers={"Authorization": f"Bearer {secret}"}).status_code == 200
    text = keyed.log.read_text()
    for key in ("host", "port", "alias", "api-key", "models-max"):
        assert f"preset [alpha]: {key} is the router's to set; dropped" in text


def test_an_answer_through_the_router_has_one_cors_origin(keyed):
    """The child's CORS headers are not relayed: a browser gets the router's, once."""
    headers = {**AUTH, "Origin": "https://app.example"}
    r = httpx.post(
        keyed.url + "/v1/completions", json={"model": "beta", "prompt": "a", "max_tokens": 2}, headers=headers
    )
    assert r.status_code == 200
    assert r.headers.get_list("access-control-allow-origin") == ["https://app.example"]


def test_a_server_that_dies_while_loading_is_a_load_failure(keyed):
    """The request that waits gets the load's error (503), the model is ``failed`` and
    counted, and it is not started again behind the client's back."""
    import threading

    got: list[httpx.Response] = []
    waiter = threading.Thread(target=lambda: got.append(complete(keyed.url, "hang", AUTH)))
    waiter.start()
    wait_for(lambda: "pid" in statuses(keyed.url, AUTH)["hang"], 60, "hang loading")
    status = statuses(keyed.url, AUTH)["hang"]
    assert status["value"] == "loading"
    os.kill(status["pid"], signal.SIGKILL)
    waiter.join(120)
    assert got and got[0].status_code == 503 and "while loading" in got[0].json()["error"]["message"], got
    after = statuses(keyed.url, AUTH)["hang"]
    assert after["value"] == "failed" and after["failed"] is True and "pid" not in after
    assert metric(keyed.url, "slotserve_router_model_load_failures_total", AUTH, model="hang") == 1


def test_props_and_slots_of_a_named_model(keyed):
    """llama.cpp's web page asks ``GET /props?model=X``; ``GET /slots?model=X`` picks a
    model when several are loaded."""
    assert complete(keyed.url, "alpha", AUTH).status_code == 200
    assert complete(keyed.url, "beta", AUTH).status_code == 200
    props = httpx.get(keyed.url + "/props", params={"model": "beta"}, headers=AUTH, timeout=60).json()
    assert props["model_alias"] == "beta" and "default_generation_settings" in props
    assert httpx.get(keyed.url + "/props", headers=AUTH).json()["role"] == "router"
    slots = httpx.get(keyed.url + "/slots", params={"model": "alpha"}, headers=AUTH, timeout=60)
    assert slots.status_code == 200 and len(slots.json()) == 1
    assert httpx.get(keyed.url + "/slots", headers=AUTH).status_code == 400  # two loaded: which?


def test_a_failed_spawn_frees_its_place(models, tmp_path):
    """A child whose process cannot even start (an argument over the kernel's limit):
    ``failed`` with the reason, and its ``--models-max`` place is free for the next."""
    preset = tmp_path / "preset.ini"
    preset.write_text(
        f"[big]\nmodel = {models / 'alpha'}\nchat-template = {'x' * 200_000}\n\n[beta]\nmodel = {models / 'beta'}\n"
    )
    with ServerProcess("--models-preset", str(preset), "--models-max", "1", "-np", "1", "-c", "256") as srv:
        srv.wait_ready()
        r = complete(srv.url, "big")
        assert r.status_code == 503 and "could not be started" in r.json()["error"]["message"], r.text
        assert statuses(srv.url)["big"]["value"] == "failed"
        assert complete(srv.url, "beta").status_code == 200


def test_a_reload_tells_the_requests_queued_for_a_removed_model(models, tmp_path):
    """``--models-max 1``, alpha busy, a request queued for beta; a reload drops beta:
    the queued request gets a 404 and no server is ever started for beta."""
    import threading

    preset = tmp_path / "preset.ini"
    preset.write_text(f"[alpha]\nmodel = {models / 'alpha'}\n\n[beta]\nmodel = {models / 'beta'}\n")
    flags = ("--models-preset", str(preset), "--models-max", "1", "-np", "1", "-c", "256")
    with ServerProcess(*flags, env={"SLOTSERVE_ROUTER_DEBUG_DELAY_S": "1"}) as srv:
        srv.wait_ready()
        assert complete(srv.url, "alpha").status_code == 200
        got: dict[str, httpx.Response] = {}
        busy = threading.Thread(target=lambda: got.setdefault("alpha", complete(srv.url, "alpha")))
        busy.start()
        wait_for(lambda: statuses(srv.url)["alpha"].get("in_flight") == 1, 60, "alpha busy")
        queued = threading.Thread(target=lambda: got.setdefault("beta", complete(srv.url, "beta")))
        queued.start()
        wait_for(lambda: statuses(srv.url)["beta"].get("queued") == 1, 60, "beta queued")
        preset.write_text(f"[alpha]\nmodel = {models / 'alpha'}\n")
        assert httpx.post(srv.url + "/models/reload", timeout=60).status_code == 200
        queued.join(60)
        busy.join(60)
        assert got["beta"].status_code == 404 and "removed" in got["beta"].json()["error"]["message"]
        assert got["alpha"].status_code == 200
        assert complete(srv.url, "alpha").status_code == 200
        for pid in children_of(srv.proc.pid):
            assert str(models / "beta") not in cmdline(pid)
        assert set(statuses(srv.url)) == {"alpha"}


def test_an_unload_gives_the_child_the_drain_timeout_then_kills_it(models, tmp_path):
    """The router's ``--drain-timeout`` (1 s) bounds an unload, not a fixed 30 s: the
    child (told to drain for 120 s by its preset) is killed mid-stream, a stream that
    needs several seconds (~5 s here) but well under 30 to finish."""
    long = make_checkpoint(tmp_path / "long", "llama", max_position_embeddings=4096)
    preset = tmp_path / "preset.ini"
    preset.write_text(f"[alpha]\nmodel = {long}\ndrain-timeout = 120\n")
    with ServerProcess("--models-preset", str(preset), "--drain-timeout", "1", "-np", "1", "-c", "4096") as srv:
        srv.wait_ready()
        assert complete(srv.url, "alpha").status_code == 200
        pid = statuses(srv.url)["alpha"]["pid"]
        unloads = []

        def unload() -> None:
            unloads.append(httpx.post(srv.url + "/models/unload", json={"model": "alpha"}, timeout=60))

        lines = stream_then(srv.url, "alpha", 3000, unload)
        assert unloads[0].status_code == 200
        assert "data: [DONE]" not in lines  # cut when the drain timeout ran out
        assert not Path(f"/proc/{pid}").exists() or "State:\tZ" in Path(f"/proc/{pid}/status").read_text()
        assert statuses(srv.url)["alpha"]["value"] == "unloaded"


def test_api_prefix_and_every_host(models, tmp_path):
    """``--api-prefix`` is the router's (its children serve at their root, where it
    asks them if they are ready), and the router listens on every ``--host``."""
    sock = tmp_path / "router.sock"
    flags = ("--models-dir", str(models), "--api-prefix", "/api", "--host", f"127.0.0.1,{sock}")
    with ServerProcess(*flags, "-np", "1", "-c", "256") as srv:
        wait_for(lambda: sock.exists(), 60, "the UNIX socket")
        assert httpx.get(srv.url + "/api/health", timeout=60).status_code == 200
        r = complete(srv.url + "/api", "beta")
        assert r.status_code == 200, r.text
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://router") as over_unix:
            assert over_unix.get("/api/models").json()["data"][1]["status"]["value"] == "loaded"
        assert httpx.get(srv.url + "/v1/models").status_code == 404  # outside the prefix


def test_health_lists_no_hidden_model(tmp_path):
    """A preset's ``dedup-cache-models`` hides the cache entry it uses from /models and
    from the public /health alike."""
    from test_router import hub_repo

    cache = tmp_path / "hub"
    hub_repo(cache, "org/tiny-GGUF", {"tiny-Q8_0.gguf": "", "tiny-Q4_K_M.gguf": ""})
    preset = tmp_path / "preset.ini"
    preset.write_text("[mine]\nhf-repo = org/tiny-GGUF:Q8_0\ndedup-cache-models = true\n")
    with ServerProcess("--models-dir", str(cache), "--models-preset", str(preset), "--api-key", KEY) as srv:
        srv.wait_ready()
        health = httpx.get(srv.url + "/health").json()["models"]
        assert set(health) == {"mine", "org/tiny-GGUF:Q4_K_M"}
        assert set(statuses(srv.url, AUTH)) == set(health)


def test_preset_keys_the_router_owns_are_dropped(tmp_path, caplog):
    preset = tmp_path / "preset.ini"
    model = tmp_path / "m.gguf"
    model.write_bytes(b"")
    preset.write_text(f"[*]\nport = 1\nctx-size = 512\n\n[m]\nmodel = {model}\nhost = 0.0.0.0\nmodels-dir = /\n")
    with caplog.at_level(logging.WARNING, "slotserve"):
        found = catalog(None, preset)
    assert found["m"].args == ("--ctx-size", "512")
    assert [r.getMessage() for r in caplog.records] == [
        "preset [*]: port is the router's to set; dropped",
        "preset [m]: host is the router's to set; dropped",
        "preset [m]: models-dir is the router's to set; dropped",
    ]


def test_the_childs_state_machine_allows_only_its_transitions():
    """Every pair of states: the table's transitions go, the others raise and change
    nothing; a load that fails is ``failed``, a crash when loaded ``unloaded``."""
    states = list(TRANSITIONS)
    for a in states:
        for b in states:
            life = Lifecycle()
            life.state = a
            if b in TRANSITIONS[a]:
                life.to(b)
                assert life.state == b
            else:
                with pytest.raises(InvalidTransition):
                    life.to(b)
                assert life.state == a
    life = Lifecycle()
    for step in ("loading", "failed", "loading", "loaded", "reserved", "loaded", "stopping", "unloaded"):
        life.to(step)
    assert life.state == "unloaded" and "loaded" not in TRANSITIONS[life.state]
    assert TRANSITIONS["removed"] == frozenset()


def test_what_a_child_gets_derives_from_the_settings_declarations():
    """Every flag and variable of a setting declared ``router=True`` stays with the
    router; the others reach the child."""
    from server.config.setting import flags_of, router_owned
    from server.config.settings import ServerSettings
    from server.router.handoff import child_args, child_env

    owned = {name: f for name, f in ServerSettings.model_fields.items() if router_owned(f)}
    assert {"models_dir", "host", "port", "api_key", "alias", "api_prefix", "cors_origins"} <= set(owned)
    for name, field in owned.items():
        on, off = flags_of(field)
        for flag in (*on, *off):
            argv = [flag] if (off or flag in off) else [flag, "x"]
            assert child_args([*argv, "-c", "512"]) == ["-c", "512"], flag
        env = child_env({f"SLOTSERVE_{name.upper()}": "x", "SLOTSERVE_CTX_SIZE": "512"}, "secret")
        assert env == {"SLOTSERVE_CTX_SIZE": "512", "SLOTSERVE_API_KEY": "secret"}, name
    assert child_args(["--host=0.0.0.0", "--temp", "0.5", "--no-metrics"]) == ["--temp", "0.5"]
