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

from .app import DashboardSettings, create_app

__all__ = ["DashboardSettings", "create_app", "serve"]


def serve(settings: DashboardSettings, host: str = "127.0.0.1", port: int = 8787) -> None:
    """Serve the dashboard until SIGINT/SIGTERM. Binds first (OSError when the
    address is taken), then prints the URL it serves on: port 0 takes a free
    port, and the line says which."""
    import socket

    import uvicorn

    app = create_app(settings)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if family == socket.AF_INET6 else host
    config = uvicorn.Config(
        app,
        log_level="warning",
        # Open event streams would hold a shutdown for ever otherwise.
        timeout_graceful_shutdown=2,
        proxy_headers=False,
    )
    mode = "read-write" if settings.read_write else "read-only"
    print(f"runrelay dashboard ({mode}) on http://{shown}:{bound}/", flush=True)
    uvicorn.Server(config).run(sockets=[sock])
