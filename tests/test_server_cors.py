"""CORS as llama-server answers it: preflights without credentials, the origin
reflected with credentials allowed, and --cors-origins (vLLM: --allowed-origins)
limiting which origins are reflected."""

from __future__ import annotations

import httpx
import pytest
from server_proc import InProcessServer

KEY = "sk-cors"
PAGE = "http://localhost:5173"


def preflight(srv, origin: str, path: str = "/v1/chat/completions") -> httpx.Response:
    headers = {
        "Origin": origin,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type",
    }
    return httpx.options(srv.url + path, headers=headers)


@pytest.fixture(scope="module")
def open_server():
    with InProcessServer(api_key=KEY) as srv:
        yield srv


def test_a_preflight_is_answered_without_the_key_and_reflects_the_origin(open_server):
    r = preflight(open_server, PAGE)
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == PAGE  # reflected, not *
    assert r.headers["access-control-allow-credentials"] == "true"
    assert "POST" in r.headers["access-control-allow-methods"]
    assert "authorization" in r.headers["access-control-allow-headers"].lower()
    assert preflight(open_server, "https://other.example", "/slots/0").status_code == 200  # every route


def test_answers_and_errors_carry_the_origin(open_server):
    ok = httpx.get(open_server.url + "/v1/models", headers={"Origin": PAGE, "Authorization": f"Bearer {KEY}"})
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == PAGE
    assert ok.headers["access-control-allow-credentials"] == "true"
    denied = httpx.get(open_server.url + "/v1/models", headers={"Origin": PAGE})
    assert denied.status_code == 401 and denied.headers["access-control-allow-origin"] == PAGE  # the page can read why
    plain = httpx.get(open_server.url + "/v1/models", headers={"Authorization": f"Bearer {KEY}"})
    assert "access-control-allow-origin" not in plain.headers  # no Origin: no CORS headers


@pytest.mark.parametrize("setting", [f"{PAGE},http://other.example/", f'["{PAGE}"]'])
def test_cors_origins_limits_the_reflected_origins(setting):
    with InProcessServer(cors_origins=setting) as srv:
        assert preflight(srv, PAGE).headers["access-control-allow-origin"] == PAGE
        evil = preflight(srv, "http://evil.example")
        assert evil.status_code == 403 and "access-control-allow-origin" not in evil.headers
        assert evil.json()["error"]["code"] == "origin_not_allowed"
        r = httpx.get(srv.url + "/v1/models", headers={"Origin": "http://evil.example"})
        assert r.status_code == 200 and "access-control-allow-origin" not in r.headers  # the browser keeps it


def test_a_malformed_origin_list_is_a_start_up_error():
    from pydantic import ValidationError

    from server.settings import ServerSettings

    with pytest.raises(ValidationError, match="cors-origins"):
        ServerSettings(cors_origins='["http://a.example", 3]')
    assert ServerSettings(cors_origins="*").cors_origins == "*"
