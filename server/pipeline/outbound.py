"""Requests this server sends out on a client's behalf (the MCP CORS proxy, image URLs):
which targets it may reach, checked after DNS resolution, and a capped GET.

- ``http`` and ``https`` URLs only, without credentials in them (400 otherwise).
- A loopback, link-local (169.254.169.254, the cloud metadata service), private,
  multicast, reserved or unspecified address is refused with 403 unless the caller's
  ``allow_private`` (its own flag); redirects are followed here, each target checked again.
- The connection goes to the address that was checked (no second lookup a rebinding DNS
  could answer differently); ``Host`` is the target's own.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from urllib.parse import urljoin, urlsplit

import httpx

from server.errors import APIError

MAX_REDIRECTS = 5
REDIRECTS = frozenset({301, 302, 303, 307, 308})


def target(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise APIError(400, f"unsupported URL scheme in target URL: {parts.scheme or '(none)'}")
    if not parts.hostname:
        raise APIError(400, "invalid target URL: missing host")
    if parts.password is not None or parts.username is not None:
        raise APIError(400, "authentication in target URL is not supported")
    return url


def forbidden(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    """Why an outbound request does not go to ``ip`` by default (None: a public address)."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    for why in ("unspecified", "loopback", "link_local", "multicast", "private", "reserved"):
        if getattr(ip, f"is_{why}"):
            return why.replace("_", "-")
    return None if ip.is_global else "non-global"  # shared (100.64/10) and the like


async def pinned(url: str, allow_private: bool, who: str, flag: str) -> tuple[str, dict, dict]:
    """``url`` with its host replaced by the address it resolves to (checked), the
    ``Host`` header and the TLS name that go with it. ``who`` and ``flag`` name the
    sender and the flag that allows private addresses, in the refusal."""
    parts = urlsplit(target(url))
    host, port = parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise APIError(502, f"{who}: the name cannot be resolved: {host}", "server_error") from exc
    addresses = [ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos]
    for ip in addresses:
        why = forbidden(ip)
        if why and not allow_private:
            raise APIError(403, f"{who} does not reach {why} addresses ({host} is {ip}): start with {flag}",
                           "permission_error")  # fmt: skip
    ip = addresses[0]
    netloc = f"[{ip}]" if ip.version == 6 else str(ip)
    pinned_url = parts._replace(netloc=f"{netloc}:{port}").geturl()
    host_header = host if parts.port is None else f"{host}:{parts.port}"
    return pinned_url, {"Host": host_header}, ({"sni_hostname": host} if parts.scheme == "https" else {})


async def fetch(url: str, allow_private: bool, who: str, flag: str, max_bytes: int, timeout: float) -> bytes:
    """GET ``url`` (redirects followed, each checked) -> its body; APIError when it is
    refused, cannot be reached, answers other than 200 or passes ``max_bytes``."""
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout), follow_redirects=False) as client:
        for _ in range(MAX_REDIRECTS + 1):
            address, host, tls = await pinned(url, allow_private, who, flag)
            request = client.build_request("GET", address, headers=host, extensions=tls)
            try:
                answer = await client.send(request, stream=True)
            except httpx.HTTPError as exc:
                raise APIError(400, f"{who}: {url} cannot be reached: {type(exc).__name__}") from exc
            try:
                location = answer.headers.get("location")
                if answer.status_code in REDIRECTS and location:
                    url = urljoin(url, location)
                    continue
                if answer.status_code != 200:
                    raise APIError(400, f"{who}: {url} answered {answer.status_code}")
                body = bytearray()
                async for chunk in answer.aiter_bytes():
                    body += chunk
                    if len(body) > max_bytes:
                        raise APIError(400, f"{who}: {url} is larger than {max_bytes} bytes")
                return bytes(body)
            except httpx.HTTPError as exc:
                raise APIError(400, f"{who}: reading {url} failed: {type(exc).__name__}") from exc
            finally:
                await answer.aclose()
    raise APIError(400, f"{who}: {url} redirected more than {MAX_REDIRECTS} times")
