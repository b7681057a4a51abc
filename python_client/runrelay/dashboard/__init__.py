"""`runrelay dashboard`: a web dashboard for queues, runs and the ledger.

Needs the `runrelay[dashboard]` extra (Starlette, Jinja2, uvicorn).

    runrelay dashboard --database-url postgresql://runrelay_admin@db/app

Pages: the overview (queues, the ledger's lanes), runs (filter, find by id,
page through), one run (attempts, waits, lifecycle and events with their
delivery state, the stored error), blocked deliveries and schedules. Every
page reads through the admin SQL functions only (docs/admin.md), and keeps
itself current from the database's notifications (live.py).

Read-only unless started with --read-write; acting then needs a login and
the session's CSRF token (app.py says exactly what is checked). See
docs/dashboard.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

from .app import DashboardSettings, create_app

__all__ = ["DashboardSettings", "Running", "create_app", "serve", "start"]


def serve(settings: DashboardSettings, host: str = "127.0.0.1", port: int = 8787) -> None:
    """Serve the dashboard until SIGINT/SIGTERM. Binds first (OSError when the
    address is taken), then prints the URL it serves on: port 0 takes a free
    port, and the line says which."""
    sock, url = _bind(host, port)
    mode = "read-write" if settings.read_write else "read-only"
    print(f"runrelay dashboard ({mode}) on {url}", flush=True)
    server = _server(settings, host)

    def stop(_signum: int, _frame: Any) -> None:
        server.should_exit = True

    # Our own handlers: uvicorn's re-raise the signal after shutting down, so
    # a SIGTERM would end the process by the signal instead of with exit 0.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop)
    server.run(sockets=[sock])


class Running:
    """A dashboard served from a background thread (start())."""

    def __init__(self, server: Any, thread: threading.Thread, url: str) -> None:
        self._server = server
        self._thread = thread
        self.url = url

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)


def start(settings: DashboardSettings, host: str = "127.0.0.1", port: int = 0) -> Running:
    """Serve the dashboard from a daemon thread (the demo does) and return once
    it accepts connections; stop() ends it."""
    sock, url = _bind(host, port)
    server = _server(settings, host)
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name="runrelay-dashboard", daemon=True
    )
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    if not server.started:
        server.should_exit = True
        raise RuntimeError("the dashboard did not start")
    return Running(server, thread, url)


def _bind(host: str, port: int) -> tuple[socket.socket, str]:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        # Listening already, so the URL printed next accepts connections at
        # once (they wait in the backlog until the app has started).
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    shown = f"[{host}]" if family == socket.AF_INET6 else host
    return sock, f"http://{shown}:{sock.getsockname()[1]}/"


def _server(settings: DashboardSettings, host: str) -> Any:
    """A uvicorn server of the app; the bound address is an allowed Host."""
    import uvicorn

    shown = f"[{host}]" if ":" in host else host
    settings = dataclasses.replace(settings, allowed_hosts=(*settings.allowed_hosts, shown))

    class _QuietServer(uvicorn.Server):
        """Installs no signal handlers: serve() has its own, and start() runs
        in a thread, where none can be installed."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    config = uvicorn.Config(
        create_app(settings),
        log_level="warning",
        # Open event streams would hold a shutdown for ever otherwise.
        timeout_graceful_shutdown=2,
        proxy_headers=False,
    )
    return _QuietServer(config)
