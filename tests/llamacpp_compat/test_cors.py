"""CORS as llama-server answers it: preflights answered without credentials, the origin
reflected with credentials allowed, `--cors-origins` (`*`, `localhost`, a list; vLLM:
`--allowed-origins`) deciding which origins are reflected, and the methods, headers and
credentials flags."""

from __future__ import annotations

import httpx
import pytest
from server_proc import InProcessServer

KEY = "sk-cors"
PAGE = "http://web.mydomain.fr"


def preflight(srv, origin: str, path: str = "/v1/chat/completions") -> httpx.Response:
    headers = {
        "Origin": origin,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "Authorization",
    }
    return httpx.options(srv.url + path, headers=headers)


@pytest.fixture(scope="module")
def open_server():
    with InProcessServer(api_key=KEY) as srv:
        yield srv


def test_a_preflight_is_answered_without_the_key(open_server):
    r = preflight(open_server, PAGE)
    assert r.status_code == 200 and r.content == b""
    assert r.headers["access-control-allow-origin"] == PAGE  # reflected, not *
    assert r.headers["access-control-allow-credentials"] == "true"
    assert r.headers["access-control-allow-methods"] == "GET, POST, DELETE, OPTIONS"
    assert r.headers["access-control-allow-headers"] == "*"
    assert preflight(open_server, "localhost", "/slots/0").headers["access-control-allow-origin"] == "localhost"


def test_answers_and_errors_carry_the_origin(open_server):
    ok = httpx.get(open_server.url + "/v1/models", headers={"Origin": PAGE, "Authorization": f"Bearer {KEY}"})
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == PAGE
    denied = httpx.get(open_server.url + "/v1/models", headers={"Origin": PAGE})
    assert denied.status_code == 401 and denied.headers["access-control-allow-origin"] == PAGE  # the page can read why
    plain = httpx.get(open_server.url + "/v1/models", headers={"Authorization": f"Bearer {KEY}"})
    assert "access-control-allow-origin" not in plain.headers  # no Origin: no CORS headers


@pytest.mark.parametrize("setting", ["http://a.example,http://b.example/", '["http://a.example", "http://b.example"]'])
def test_a_list_of_origins_limits_the_reflected_ones(setting):
    with InProcessServer(cors_origins=setting) as srv:
        assert preflight(srv, "http://b.example").headers["access-control-allow-origin"] == "http://b.example"
        evil = preflight(srv, "http://evil.example")
        assert evil.status_code == 200 and "access-control-allow-origin" not in evil.headers
        r = httpx.get(srv.url + "/v1/models", headers={"Origin": "http://evil.example"})
        assert r.status_code == 200 and "access-control-allow-origin" not in r.headers  # the browser keeps it


def test_localhost_reflects_only_local_origins_and_the_flags_apply():
    settings = dict(cors_origins="localhost", cors_methods="GET, POST", cors_headers="Authorization, Content-Type")
    with InProcessServer(**settings, cors_credentials=False) as srv:
        for origin in ("http://localhost", "http://127.0.0.1:3000", "http://[::1]:3000"):
            assert preflight(srv, origin).headers["access-control-allow-origin"] == origin
        for origin in ("http://evil.com", "http://localhost.evil.com", "http://notlocalhost"):
            assert "access-control-allow-origin" not in preflight(srv, origin).headers
        r = preflight(srv, "http://localhost:8080")
        assert r.headers["access-control-allow-methods"] == "GET, POST"
        assert r.headers["access-control-allow-headers"] == "Authorization, Content-Type"
        assert r.headers["access-control-allow-credentials"] == "false"
    with InProcessServer(cors_credentials=False) as srv:
        assert preflight(srv, PAGE).headers["access-control-allow-origin"] == "*"  # no credentials: the wildcard


def test_a_malformed_origin_list_is_a_start_up_error():
    from pydantic import ValidationError

    from server.config.settings import ServerSettings

    with pytest.raises(ValidationError, match="cors-origins"):
        ServerSettings(cors_origins='["http://a.example", 3]')


@pytest.fixture(scope="module")
def keyless_server():
    with InProcessServer(cors_origins="http://a.example") as srv:
        yield srv


SIMPLE = ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None]


@pytest.mark.parametrize("content_type", SIMPLE)
@pytest.mark.parametrize("origin", ["http://a.example", "http://evil.example"])
def test_a_cross_site_simple_post_is_refused_and_changes_nothing(keyless_server, origin, content_type):
    """What a page on another site can send without a preflight: refused 403 in the error
    shape, whatever the origin (an allowed page must send JSON, which preflights)."""
    url = keyless_server.url + "/lora-adapters"
    before = httpx.get(url).json()
    headers = {"Origin": origin} | ({"Content-Type": content_type} if content_type else {})
    r = httpx.post(url, content=b"[]", headers=headers)
    assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error", r.text
    r = httpx.post(keyless_server.url + "/v1/completions", content=b'{"prompt": "a", "max_tokens": 1}', headers=headers)
    assert r.status_code == 403
    assert httpx.get(url).json() == before


def test_a_disallowed_origin_is_refused_even_with_json(keyless_server):
    body = {"prompt": "a", "max_tokens": 1}
    r = httpx.post(keyless_server.url + "/v1/completions", json=body, headers={"Origin": "http://evil.example"})
    assert r.status_code == 403 and "--cors-origins" in r.json()["error"]["message"]
    r = httpx.post(keyless_server.url + "/v1/completions", json=body, headers={"Origin": "http://a.example"})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://a.example"


def test_curl_and_the_servers_own_page_keep_working(keyless_server):
    body = b'{"prompt": "a", "max_tokens": 1}'
    form = {"Content-Type": "application/x-www-form-urlencoded"}  # what curl -d sends: no Origin
    assert httpx.post(keyless_server.url + "/v1/completions", content=body, headers=form).status_code == 200
    own = keyless_server.url  # the web page, served here: its origin is this host
    r = httpx.post(keyless_server.url + "/v1/completions", content=body, headers={"Origin": own, **form})
    assert r.status_code == 200


@pytest.fixture(scope="module")
def default_server(tmp_path_factory):
    """A default start (``--cors-origins *``, no key) with slot files and the CORS proxy on."""
    slots = tmp_path_factory.mktemp("slots")
    with InProcessServer(slot_save_path=slots, ui_mcp_proxy=True, ui_mcp_proxy_private=True) as srv:
        yield srv


EVIL = {"Origin": "http://evil.example", "Content-Type": "application/json"}


def test_a_default_start_refuses_pages_on_other_sites_its_state(default_server):
    """With ``*`` every page may read completions, but no page visited may erase,
    restore or read slots, delete slot files, change LoRA scales or use the CORS proxy
    (rule 2 of server/middleware/cross_site.py), even with a JSON body that passes
    the preflight, and even without an ``Origin`` (``<img>``: ``Sec-Fetch-Site``)."""
    url = default_server.url
    done = httpx.post(url + "/v1/completions", json={"prompt": "a", "max_tokens": 1}, headers=EVIL)
    assert done.status_code == 200 and done.headers["access-control-allow-origin"] == "http://evil.example"
    assert httpx.post(url + "/slots/0?action=save", json={"filename": "kept.bin"}).status_code == 200
    saved = sorted(p.name for p in default_server.state.settings.slot_save_path.iterdir())
    tries = [
        httpx.post(url + "/slots/0?action=erase", json={}, headers=EVIL),
        httpx.post(url + "/slots/0?action=restore", json={"filename": "kept.bin"}, headers=EVIL),
        httpx.get(url + "/slots", headers=EVIL),
        httpx.get(url + "/slots/files", headers=EVIL),
        httpx.delete(url + "/slots/files/kept.bin", headers=EVIL),
        httpx.post(url + "/lora-adapters", json=[], headers=EVIL),
        httpx.get(url + "/cors-proxy", params={"url": url + "/health"}, headers=EVIL),
        httpx.get(url + "/cors-proxy", params={"url": url + "/health"}, headers={"Sec-Fetch-Site": "cross-site"}),
    ]
    for r in tries:
        assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error", (r.request.url, r.text)
        assert "--cors-origins" in r.json()["error"]["message"] or "API key" in r.json()["error"]["message"]
    assert sorted(p.name for p in default_server.state.settings.slot_save_path.iterdir()) == saved
    assert httpx.get(url + "/slots").json()[0]["n_ctx"] > 0  # curl (no Origin) and the server's own page pass
    own = {"Origin": url, "Sec-Fetch-Site": "same-origin"}
    assert httpx.get(url + "/cors-proxy", params={"url": url + "/health"}, headers=own).status_code == 200


def test_a_named_origin_or_a_key_opens_the_guarded_paths():
    """``--cors-origins`` naming the page's origin lets it in (others stay out); with an
    API key the key decides."""
    with InProcessServer(cors_origins=PAGE) as srv:
        assert httpx.post(srv.url + "/lora-adapters", json=[], headers={**EVIL, "Origin": PAGE}).status_code == 200
        assert httpx.post(srv.url + "/lora-adapters", json=[], headers=EVIL).status_code == 403
    with InProcessServer(api_key=KEY) as srv:
        keyed = {**EVIL, "Authorization": f"Bearer {KEY}"}
        assert httpx.post(srv.url + "/lora-adapters", json=[], headers=keyed).status_code == 200
        assert httpx.post(srv.url + "/lora-adapters", json=[], headers=EVIL).status_code == 401
