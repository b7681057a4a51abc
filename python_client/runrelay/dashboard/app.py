"""The dashboard's web app: pages over the admin SQL functions, and actions.

Every read and every action is one call of an admin function through
AsyncClient (docs/admin.md); the app never reads a table. Pages are rendered
on the server; a small script (static/dashboard.js) keeps the parts marked
`data-live` current from the event stream (live.py).

Who may do what:

* **Viewing.** With a password configured, every page needs a login; with
  none, pages are open to whoever reaches the port (it listens on
  127.0.0.1 by default).
* **Acting** (cancel, retry, signal, requeue, pause, resume) needs all of:
  the dashboard started read-write (it is read-only by default), a
  password configured and a logged-in session, a request from the
  dashboard's own origin, and the session's CSRF token in the form
  (sessions.py). Anything else is refused with 403 and changes nothing.
  cancel, retry and signal carry a call id made when the form was drawn,
  so a form sent twice (a double click, a resent POST) is applied once:
  the repeat answers the first outcome.

The application state (state.py) is one object each handler is given;
the pages are pages.py, logging in and out auth.py, the actions actions.py,
the middleware middleware.py. This module makes the app: the state, the
routes, the database pool for the app's life, the event stream and the
health check.

The database role is whatever --database-url connects as; the admin
functions need the install's admin role (runrelay_admin) or a member of it,
and cancel and signal call the producer's functions (cancel_run,
signal_run), which need runrelay_producer as well.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable

import psycopg
from psycopg_pool import AsyncConnectionPool
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from .. import errors
from ..client import AsyncClient
from . import auth, pages
from .actions import act
from .live import event_stream
from .middleware import LOOPBACK_HOSTS, _AllowedHosts, _ForwardedFrom, _SecurityHeaders
from .state import HERE, POOL_TIMEOUT_SECONDS, Dashboard, DashboardSettings

__all__ = ["Dashboard", "DashboardSettings", "create_app"]

Handler = Callable[[Dashboard, Request], Awaitable[Response]]


def create_app(settings: DashboardSettings) -> Starlette:
    d = Dashboard(settings)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        pool = AsyncConnectionPool(
            settings.database_url,
            min_size=1,
            max_size=settings.pool_size,
            kwargs={"autocommit": True},
            open=False,
            # A page waits this long for a connection, then says the database
            # is unreachable, instead of hanging.
            timeout=POOL_TIMEOUT_SECONDS,
            # A connection is checked as it leaves the pool, so that after a
            # restart of the database (or a proxy closing idle connections) a
            # page or an action gets a fresh one rather than an error.
            check=AsyncConnectionPool.check_connection,
        )
        await pool.open()
        d.client = AsyncClient(pool, schema=settings.schema)
        listener = asyncio.create_task(d.notifications.run())
        try:
            yield
        finally:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener
            await pool.close()

    def bound(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        """A route's endpoint: `handler` of this app's state."""

        async def endpoint(request: Request) -> Response:
            return await handler(d, request)

        return endpoint

    routes = [
        Route("/", pages.page(d, "overview.html", pages.overview)),
        Route("/runs", pages.page(d, "runs.html", pages.runs)),
        Route("/run", pages.page(d, "run.html", pages.run)),
        Route("/deliveries", pages.page(d, "deliveries.html", pages.deliveries)),
        Route("/skip", pages.page(d, "skip.html", pages.skip)),
        Route("/processes", pages.page(d, "processes.html", pages.processes)),
        Route("/schedules", pages.page(d, "schedules.html", pages.schedules)),
        Route("/login", bound(auth.login), methods=["GET", "POST"]),
        Route("/logout", bound(auth.logout), methods=["POST"]),
        Route("/actions/{action}", bound(act), methods=["POST"]),
        Route("/live", bound(live)),
        Route("/healthz", bound(health)),
        Mount("/static", StaticFiles(directory=os.path.join(HERE, "static")), name="static"),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.add_middleware(_SecurityHeaders)
    app.add_middleware(_ForwardedFrom, proxies=settings.trusted_proxies)
    app.add_middleware(_AllowedHosts, hosts=(*LOOPBACK_HOSTS, *settings.allowed_hosts))
    return app


async def live(d: Dashboard, request: Request) -> Response:
    if not d.can_view(d.session_of(request)):
        return Response("log in first", status_code=403)
    return StreamingResponse(
        event_stream(d.notifications),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def health(d: Dashboard, _request: Request) -> Response:
    try:
        version = await d.client.get_schema_version()
    except (psycopg.Error, errors.RunrelayError) as exc:
        return JSONResponse({"ok": False, "error": str(exc)}, status_code=503)
    return JSONResponse(
        {"ok": True, "schema_version": version, "listening": d.notifications.listening}
    )
