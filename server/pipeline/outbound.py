"""Requests this server sends out on a client's behalf (the MCP CORS proxy, image URLs):
which targets it may reach, checked after DNS resolution, and a capped GET.

- ``http`` and ``https`` URLs only, without credentials in them (400 otherwise).
- A loopback, link-local (169.254.169.254, the cloud metadata service), private,
  multicast, reserved or unspecified address is refused with 403 unless the caller's
  ``allow_private`` (its own flag); redirects are followed here, each target checked again.
- The connection goes to an address that was checked (no second lookup a rebinding DNS
  could answer differently), each of the name's addresses tried in turn until one
  accepts; ``Host`` is the target's own.
- One TLS context for every outbound client of the process (``tls``): httpx's default
  loads the CA bundle for each client it builds, ~80 ms of CPU on the event loop.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import socket
import ssl
import zlib
from urllib.parse import urljoin, urlsplit

import httpx

from server.errors import APIError

MAX_REDIRECTS = 5
REDIRECTS = frozenset({301, 302, 303, 307, 308})


@functools.cache
def tls() -> ssl.SSLContext:
    """The process's context for outbound HTTPS (the CA bundle httpx would load, with
    ``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` as httpx reads them), built on first use."""
    return httpx.create_ssl_context()


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


async def pinned(url: str, allow_private: bool, who: str, flag: str) -> list[tuple[str, dict, dict]]:
    """For each address ``url``'s host resolves to (all checked), in the resolver's
    order: the URL with its host replaced by that address, the ``Host`` header and the
    TLS name that go with it. ``who`` and ``flag`` name the sender and the flag that
    allows private addresses, in the refusal."""
    parts = urlsplit(target(url))
    host, port = parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise APIError(502, f"{who}: the name cannot be resolved: {host}", "server_error") from exc
    addresses = list(dict.fromkeys(ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos))
    for ip in addresses:
        why = forbidden(ip)
        if why and not allow_private:
            raise APIError(403, f"{who} does not reach {why} addresses ({host} is {ip}): start with {flag}",
                           "permission_error")  # fmt: skip
    host_header = host if parts.port is None else f"{host}:{parts.port}"
    tls = {"sni_hostname": host} if parts.scheme == "https" else {}
    out = []
    for ip in addresses:
        netloc = f"[{ip}]" if ip.version == 6 else str(ip)
        out.append((parts._replace(netloc=f"{netloc}:{port}").geturl(), {"Host": host_header}, tls))
    return out


async def send_pinned(
    client: httpx.AsyncClient, method: str, url: str, allow_private: bool, who: str, flag: str, **request
) -> httpx.Response:
    """``method url`` sent to the first of its checked addresses that accepts a
    connection (as a browser tries each address of a name), its answer streamed.
    ``request``: headers (``Host`` is added), content. Raises httpx.HTTPError from the
    last address tried when none answers."""
    headers = request.pop("headers", {})
    last: httpx.HTTPError | None = None
    for address, host, tls in await pinned(url, allow_private, who, flag):
        built = client.build_request(method, address, headers={**headers, **host}, extensions=tls, **request)
        try:
            return await client.send(built, stream=True)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            last = exc  # the next address
    raise last if last is not None else httpx.ConnectError(f"{url}: no address")


class _Inflater:
    """A ``Content-Encoding`` undone within a size limit: each step decompresses at most
    what the limit leaves (plus one byte, to tell it was passed), so a small file that
    inflates to gigabytes never does here."""

    def __init__(self, encoding: str):
        kinds = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
        self.inflate = zlib.decompressobj(kinds[encoding]) if encoding in kinds else None

    def feed(self, chunk: bytes, room: int) -> bytes:
        if self.inflate is None:
            return chunk
        out = bytearray()
        data = chunk
        while data and len(out) <= room:
            out += self.inflate.decompress(data, room + 1 - len(out))
            data = self.inflate.unconsumed_tail
        return bytes(out)


async def fetch(url: str, allow_private: bool, who: str, flag: str, max_bytes: int, timeout: float) -> bytes:
    """GET ``url`` (redirects followed, each checked) -> its body, all within ``timeout``
    seconds (a deadline: a server that sends a byte now and then does not hold the
    request longer); APIError when it is refused, cannot be reached, is too slow,
    answers other than 200, or passes ``max_bytes`` (also decompressed, checked as it
    inflates)."""
    try:
        async with asyncio.timeout(timeout):
            return await _fetch(url, allow_private, who, flag, max_bytes, timeout)
    except TimeoutError:
        raise APIError(400, f"{who}: {url} did not arrive within {timeout:g} s") from None


async def _fetch(url: str, allow_private: bool, who: str, flag: str, max_bytes: int, timeout: float) -> bytes:
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout), follow_redirects=False, verify=tls()) as client:
        for _ in range(MAX_REDIRECTS + 1):
            try:
                answer = await send_pinned(
                    client, "GET", url, allow_private, who, flag, headers={"Accept-Encoding": "gzip, deflate"}
                )
            except httpx.HTTPError as exc:
                raise APIError(400, f"{who}: {url} cannot be reached: {type(exc).__name__}") from exc
            try:
                location = answer.headers.get("location")
                if answer.status_code in REDIRECTS and location:
                    url = urljoin(url, location)
                    continue
                if answer.status_code != 200:
                    raise APIError(400, f"{who}: {url} answered {answer.status_code}")
                encoding = answer.headers.get("content-encoding", "identity").strip().lower()
                if encoding not in ("identity", "gzip", "x-gzip", "deflate"):
                    raise APIError(400, f"{who}: {url} came in an encoding not taken: {encoding}")
                inflater, body = _Inflater(encoding), bytearray()
                async for chunk in answer.aiter_raw():
                    body += inflater.feed(chunk, max_bytes - len(body))
                    if len(body) > max_bytes:
                        raise APIError(400, f"{who}: {url} is larger than {max_bytes} bytes")
                return bytes(body)
            except (httpx.HTTPError, zlib.error) as exc:
                raise APIError(400, f"{who}: reading {url} failed: {type(exc).__name__}") from exc
            finally:
                await answer.aclose()
    raise APIError(400, f"{who}: {url} redirected more than {MAX_REDIRECTS} times")
