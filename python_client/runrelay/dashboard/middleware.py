"""The dashboard's ASGI middleware: the Host names it answers, the proxies
whose forwarded scheme and address it believes, and its security headers."""

from __future__ import annotations

from typing import Any, ClassVar

from starlette.responses import PlainTextResponse

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]", "::1")


def _host_name(host: str) -> str:
    """A Host header without its port, lower case ("[::1]:8787" -> "[::1]")."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[: host.find("]") + 1] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


class _AllowedHosts:
    """Answers only requests whose Host is one of `hosts`: a page fetched
    through a DNS-rebound name reaches the server with that name as Host
    and gets 400 with no content."""

    def __init__(self, app: Any, hosts: tuple[str, ...]) -> None:
        self.app = app
        self.hosts = frozenset(_host_name(h) for h in hosts)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] in ("http", "websocket"):
            headers = dict(scope.get("headers") or [])
            host = _host_name(headers.get(b"host", b"").decode("latin-1"))
            if host not in self.hosts:
                response = PlainTextResponse("unknown Host", status_code=400)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


class _ForwardedFrom:
    """Takes the scheme and client address from X-Forwarded-Proto and
    X-Forwarded-For, but only when the peer is a trusted proxy: anyone else
    could claim https or another address with them."""

    def __init__(self, app: Any, proxies: tuple[str, ...]) -> None:
        self.app = app
        self.proxies = frozenset(proxies)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        peer = scope.get("client")
        if scope["type"] in ("http", "websocket") and peer and peer[0] in self.proxies:
            headers = dict(scope.get("headers") or [])
            proto = headers.get(b"x-forwarded-proto", b"").decode("latin-1")
            # The proxy appends the address it saw: the last entry is its.
            forwarded = headers.get(b"x-forwarded-for", b"").decode("latin-1")
            scope = dict(scope)
            if proto.strip().lower() in ("http", "https"):
                scheme = proto.strip().lower()
                scope["scheme"] = (
                    scheme if scope["type"] == "http" else scheme.replace("http", "ws")
                )
            if forwarded.strip():
                scope["client"] = (forwarded.split(",")[-1].strip(), 0)
        await self.app(scope, receive, send)


class _SecurityHeaders:
    """No inline script or style, no framing, no sniffing: a page that cannot
    run injected script and cannot be overlaid to trick a click."""

    HEADERS: ClassVar[list[tuple[bytes, bytes]]] = [
        (
            b"content-security-policy",
            b"default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
            b"connect-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
        ),
        (b"x-frame-options", b"DENY"),
        (b"x-content-type-options", b"nosniff"),
        (b"referrer-policy", b"same-origin"),
    ]

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                message["headers"] = list(message["headers"]) + self.HEADERS
            await send(message)

        await self.app(scope, receive, send_with_headers)
