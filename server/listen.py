"""The listening sockets of a server or a router: one per ``--host`` (llama-server takes
several, and a path ending in ``.sock`` as a UNIX socket), bound before uvicorn starts
so a bad address is one clear line and an exit code."""

from __future__ import annotations

import os
import socket
import stat


def _listen(sock: socket.socket, address, where: str) -> socket.socket:
    """``sock`` bound to ``address``, listening, inheritable by child processes."""
    try:
        sock.bind(address)
    except OSError as exc:
        raise SystemExit(f"error: {where}: {exc}") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _unix(path: str) -> socket.socket:
    """A UNIX socket at ``path`` (an address ending in ``.sock``, as llama-server reads
    one); a socket file left there by an earlier run is replaced, any other file is an
    error."""
    if os.path.exists(path):
        if not stat.S_ISSOCK(os.stat(path).st_mode):
            raise SystemExit(f"error: --host {path}: a file that is not a socket is in the way")
        os.unlink(path)
    return _listen(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM), path, f"--host {path}")


def _tcp(host: str, port: int) -> socket.socket:
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    return _listen(sock, address, f"--host {host} --port {port}")


def bind(hosts: list[str], port: int) -> list[socket.socket]:
    """One listening socket per address (llama-server takes several --host, and a path
    ending in ``.sock`` as a UNIX socket)."""
    return [_unix(host) if host.endswith(".sock") else _tcp(host, port) for host in hosts]
