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

The database role is whatever --database-url connects as; the admin
functions need the install's admin role (runrelay_admin) or a member of it,
and cancel and signal call the producer's functions (cancel_run,
signal_run), which need runrelay_producer as well.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import secrets
import time
import urllib.parse
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, ClassVar

import jinja2
import psycopg
from markupsafe import escape
from psycopg_pool import AsyncConnectionPool, PoolTimeout
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from .. import errors
from ..client import AsyncClient
from ..contract import LANES
from ..types import RunStatus, presumed_dead_holder
from . import present
from .live import Notifications, event_stream
from .sessions import COOKIE, Sessions, password_matches, same_token

log = logging.getLogger("runrelay.dashboard")

HERE = os.path.dirname(__file__)
STATUSES = [s.value for s in RunStatus]
# A form larger than this is refused before it is parsed.
MAX_FORM_BYTES = 64 * 1024
POOL_TIMEOUT_SECONDS = 5.0
# Events and attempts shown on a run's page, per lane.
RUN_PAGE_ROWS = 200
# The X-Requested-With of dashboard.js's own refreshes of a live page.
LIVE_REFRESH = "runrelay-live"
# The actions that call a producer function (cancel_run, signal_run) rather
# than an admin one: the login needs <schema>_producer for them.
PRODUCER_ACTIONS = frozenset({"cancel", "signal"})


@dataclass(frozen=True)
class DashboardSettings:
    """How `runrelay dashboard` was started."""

    database_url: str
    schema: str = "runrelay"
    # Actions are refused unless this is set (and a password is, and the
    # session logged in).
    read_write: bool = False
    # None: pages need no login and the dashboard cannot act.
    password: str | None = None
    # Signs session cookies; None: a random one for this process.
    secret: bytes | None = None
    page_size: int = 50
    pool_size: int = 4
    # Host header names (no port) the dashboard answers besides the loopback
    # names (localhost, 127.0.0.1, [::1]); any other Host gets 400 and
    # nothing else, so a DNS-rebound name cannot read the pages.
    allowed_hosts: tuple[str, ...] = ()
    # Failed logins allowed per client address, and from all addresses
    # together, within login_window seconds; beyond that every login (even
    # a right one) is refused with 429 until the window has passed.
    login_attempts: int = 10
    login_attempts_total: int = 100
    login_window: float = 300.0
    # Peer addresses of TLS proxies whose X-Forwarded-Proto and
    # X-Forwarded-For are believed (the scheme decides the cookie's Secure
    # flag, the address keys the login limiter); from any other peer those
    # headers are ignored.
    trusted_proxies: tuple[str, ...] = ()


# The database's failures that a later try may not meet: unreachable, no
# connection free in time, a lock or a statement that took too long.
_UNAVAILABLE = (psycopg.OperationalError, PoolTimeout, errors.LockTimeout, errors.StatementTimeout)


class Refused(Exception):
    """An action refused before it reached the database (403), or a form
    that cannot be read (400)."""

    def __init__(self, message: str, status: int = 403) -> None:
        super().__init__(message)
        self.status = status


class BadForm(Exception):
    """A field of an action's form is invalid; nothing was called."""


def create_app(settings: DashboardSettings) -> Starlette:
    if settings.read_write and not settings.password:
        raise ValueError(
            "a read-write dashboard needs a password (RUNRELAY_DASHBOARD_PASSWORD): "
            "actions are only taken for a logged-in session"
        )
    sessions = Sessions(settings.secret or secrets.token_bytes(32), password=settings.password)
    limiter = LoginLimiter(
        settings.login_attempts, settings.login_attempts_total, settings.login_window
    )
    templates = jinja2.Environment(
        loader=jinja2.FileSystemLoader(os.path.join(HERE, "templates")),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
    templates.filters.update(
        when=present.when,
        age=present.age,
        seconds=present.seconds_text,
        pretty_json=present.pretty_json,
        error_summary=present.error_summary,
        traceback_of=present.traceback_of,
        sparkline=present.sparkline,
        per_minute=present.per_minute,
        status_class=present.status_class,
    )
    notifications = Notifications(settings.database_url, settings.schema)
    state: dict[str, Any] = {}

    def client() -> AsyncClient:
        return state["client"]  # type: ignore[no-any-return]

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
        state["client"] = AsyncClient(pool, schema=settings.schema)
        listener = asyncio.create_task(notifications.run())
        try:
            yield
        finally:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener
            await pool.close()

    # -- sessions and rendering ----------------------------------------------------
    def session_of(request: Request) -> dict[str, Any]:
        return sessions.load(request.cookies.get(COOKIE)) or sessions.new()

    def can_view(session: dict[str, Any]) -> bool:
        return settings.password is None or bool(session.get("user"))

    def can_act(session: dict[str, Any]) -> bool:
        return settings.read_write and settings.password is not None and bool(session.get("user"))

    def with_cookie(response: Response, request: Request, session: dict[str, Any]) -> Response:
        response.set_cookie(
            COOKIE,
            sessions.dump(session),
            max_age=sessions.max_age,
            httponly=True,
            samesite="lax",
            secure=request.url.scheme == "https",
            path="/",
        )
        return response

    def render(
        request: Request,
        template: str,
        session: dict[str, Any],
        status: int = 200,
        **context: Any,
    ) -> Response:
        # dashboard.js refreshing the page it shows (live updates) leaves the
        # session alone: it must not take the line an action left for the page
        # the browser is loading after it (the action's own notification sets
        # off such a refresh at that very moment), nor write back a cookie
        # that a newer one may have replaced meanwhile.
        refresh = request.headers.get("x-requested-with") == LIVE_REFRESH
        flash = None if refresh else session.pop("flash", None)
        html = templates.get_template(template).render(
            request=request,
            page=template.removesuffix(".html"),
            user=session.get("user"),
            can_act=can_act(session),
            read_write=settings.read_write,
            needs_login=settings.password is not None,
            csrf=session["csrf"],
            flash=flash,
            now=datetime.now(UTC),
            new_call_id=lambda: str(uuid.uuid4()),
            here=_here(request),
            **context,
        )
        response = HTMLResponse(html, status_code=status)
        return response if refresh else with_cookie(response, request, session)

    def to_login(request: Request) -> Response:
        target = "/login?" + urllib.parse.urlencode({"next": _here(request)})
        return RedirectResponse(target, status_code=303)

    def page(
        template: str, body: Callable[[Request], Awaitable[dict[str, Any]]]
    ) -> Callable[[Request], Awaitable[Response]]:
        """A page handler: login check, the body's reads, rendering, and the
        database's failures as error pages."""

        async def handle(request: Request) -> Response:
            session = session_of(request)
            if not can_view(session):
                return to_login(request)
            try:
                context = await body(request)
            except _Redirect as redirect:
                return RedirectResponse(redirect.target, status_code=303)
            except errors.InvalidArgument as exc:
                problem = ("Bad request", str(exc), 400)
            except errors.PermissionDenied as exc:
                problem = ("Not allowed", _role_hint(exc, f"{settings.schema}_admin"), 403)
            except errors.SchemaMissing as exc:
                problem = ("No runrelay schema", str(exc), 503)
            except _UNAVAILABLE as exc:
                log.warning("database unreachable or busy: %s", exc)
                problem = ("Database unreachable or busy", present.error_summary(str(exc)), 503)
            else:
                return render(request, template, session, **context)
            title, message, status = problem
            return render(request, "error.html", session, status, title=title, message=message)

        return handle

    # -- pages ----------------------------------------------------------------------
    async def overview(_request: Request) -> dict[str, Any]:
        queues = [
            {
                **dataclasses.asdict(q),
                "ended_per_minute": [
                    a + b for a, b in zip(q.completed_per_minute, q.failed_per_minute, strict=True)
                ],
            }
            for q in await client().queue_overview()
        ]
        lanes = await client().ledger_overview()
        return {"queues": queues, "lanes": lanes}

    async def runs(request: Request) -> dict[str, Any]:
        q = request.query_params
        wanted = (q.get("id") or "").strip()
        if wanted and await client().get_run(wanted) is not None:
            raise _Redirect("/run?" + urllib.parse.urlencode({"id": wanted}))
        queue = (q.get("queue") or "").strip() or None
        status = q.get("status") or None
        if status is not None and status not in STATUSES:
            raise errors.InvalidArgument(f"status must be one of {', '.join(STATUSES)}")
        key = (q.get("key") or "").strip() or None
        after_at = _timestamp(q.get("after_at"))
        after_id = q.get("after_id") if after_at is not None else None
        rows = await client().list_runs(
            queue=queue,
            status=status,
            concurrency_key=key,
            after_created_at=after_at,
            after_run_id=after_id,
            max_rows=settings.page_size + 1,
        )
        more = len(rows) > settings.page_size
        rows = rows[: settings.page_size]
        filters = {k: v for k, v in (("queue", queue), ("status", status), ("key", key)) if v}
        next_url = None
        if more:
            last = rows[-1]
            cursor = {"after_at": last.created_at.isoformat(), "after_id": last.run_id}
            next_url = "/runs?" + urllib.parse.urlencode({**filters, **cursor})
        return {
            "runs": rows,
            "filters": filters,
            "statuses": STATUSES,
            "searched": wanted,
            "paged": after_at is not None,
            "first_url": "/runs?" + urllib.parse.urlencode(filters),
            "next_url": next_url,
        }

    async def run(request: Request) -> dict[str, Any]:
        run_id = request.query_params.get("id") or ""
        if not run_id:
            raise _Redirect("/runs")
        detail = await client().get_run(run_id)
        if detail is None:
            return {"run": None, "run_id": run_id, "attempts": [], "steps": [], "lanes": {}}
        attempts = await client().run_attempts(run_id, max_rows=RUN_PAGE_ROWS)
        steps = await client().run_steps(run_id, max_rows=RUN_PAGE_ROWS)
        processes = []
        if str(detail.status) == "running":
            # Not through a sharded install's proxy (each shard has its own).
            with contextlib.suppress(psycopg.errors.FeatureNotSupported):
                processes = await client().list_processes()
        lanes = {
            lane: await client().run_ledger_events(run_id, lane=lane, max_rows=RUN_PAGE_ROWS)
            for lane in LANES
        }
        return {
            "run": detail,
            "run_id": run_id,
            "attempts": attempts,
            "dead_holder": presumed_dead_holder(attempts, processes),
            "steps": steps,
            "lanes": lanes,
            "blocked": [
                lane
                for lane, events in lanes.items()
                if any(str(e.state) == "failed" for e in events)
            ],
            "history": present.attempt_history(detail, attempts),
            "retryable": str(detail.status) in ("failed", "cancelled"),
            "live": str(detail.status) in ("queued", "running", "waiting"),
            "page_rows": RUN_PAGE_ROWS,
        }

    async def deliveries(request: Request) -> dict[str, Any]:
        q = request.query_params
        lane = q.get("lane") or None
        if lane is not None and lane not in LANES:
            raise errors.InvalidArgument(f"lane must be one of {', '.join(LANES)}")
        after_run = q.get("after_run") or None
        after_lane = q.get("after_lane") or None
        heads = await client().list_blocked_heads(
            lane=lane,
            after_run_id=after_run,
            after_lane=after_lane if after_run else None,
            max_rows=settings.page_size + 1,
        )
        more = len(heads) > settings.page_size
        heads = heads[: settings.page_size]
        base = {"lane": lane} if lane else {}
        next_url = None
        if more:
            cursor = {"after_run": heads[-1].run_id, "after_lane": str(heads[-1].lane)}
            next_url = "/deliveries?" + urllib.parse.urlencode({**base, **cursor})
        return {
            "heads": heads,
            "lane": lane,
            "lanes": LANES,
            "paged": after_run is not None,
            "first_url": "/deliveries?" + urllib.parse.urlencode(base),
            "next_url": next_url,
        }

    async def skip(request: Request) -> dict[str, Any]:
        """The confirmation step of a skip: the blocked head it would end, a
        reason to give, and the one form that posts it."""
        q = request.query_params
        run_id = (q.get("run_id") or "").strip()
        lane = q.get("lane") or ""
        if not run_id or lane not in LANES:
            raise errors.InvalidArgument(f"pass run_id and a lane ({', '.join(LANES)})")
        heads = await client().list_blocked_heads(run_id=run_id, lane=lane, max_rows=1)
        return {"run_id": run_id, "lane": lane, "head": heads[0] if heads else None}

    async def processes(_request: Request) -> dict[str, Any]:
        return {"processes": await client().list_processes()}

    async def schedules(request: Request) -> dict[str, Any]:
        after = request.query_params.get("after") or None
        rows = await client().list_schedules(after_name=after, max_rows=settings.page_size + 1)
        more = len(rows) > settings.page_size
        rows = rows[: settings.page_size]
        next_url = None
        if more:
            next_url = "/schedules?" + urllib.parse.urlencode({"after": rows[-1].name})
        return {"schedules": rows, "paged": after is not None, "next_url": next_url}

    # -- login ----------------------------------------------------------------------
    async def login(request: Request) -> Response:
        session = session_of(request)
        next_url = _local(request.query_params.get("next"))
        if settings.password is None:
            return RedirectResponse(next_url, status_code=303)
        if request.method == "GET":
            return render(request, "login.html", session, next_url=next_url, failed=False)
        try:
            form = await _form(request)
        except Refused as exc:
            return _refusal(exc)
        next_url = _local(form.get("next"))
        if not same_token(form.get("csrf"), session["csrf"]):
            return _refusal(
                Refused("the login form expired or was not this dashboard's; reload it")
            )
        peer = request.client.host if request.client else ""
        if limiter.blocked(peer):
            log.warning("dashboard: login from %s refused: too many failed logins", peer)
            return PlainTextResponse("too many failed logins; try again later", status_code=429)
        name = (form.get("name") or "").strip()
        if not name or not password_matches(form.get("password") or "", settings.password):
            limiter.failed(peer)
            await asyncio.sleep(0.5)  # slows a guesser down; a person barely notices
            log.warning("dashboard: failed login for %r", name)
            return render(request, "login.html", session, 401, next_url=next_url, failed=True)
        # A new session (and a new CSRF token) at every login.
        fresh = sessions.new()
        fresh["user"] = name[:100]
        log.info("dashboard: %s logged in", fresh["user"])
        return with_cookie(RedirectResponse(next_url, status_code=303), request, fresh)

    async def logout(request: Request) -> Response:
        session = sessions.load(request.cookies.get(COOKIE))
        try:
            form = await _form(request)
        except Refused as exc:
            return _refusal(exc)
        if session is None or not same_token(form.get("csrf"), session["csrf"]):
            return _refusal(Refused("missing or wrong CSRF token"))
        sessions.revoke(session)
        return with_cookie(RedirectResponse("/login", status_code=303), request, sessions.new())

    # -- actions --------------------------------------------------------------------
    async def act(request: Request) -> Response:
        name = request.path_params["action"]
        session = sessions.load(request.cookies.get(COOKIE))
        try:
            if not settings.read_write:
                raise Refused("this dashboard is read-only (start it with --read-write to act)")
            if session is None or not session.get("user"):
                raise Refused("log in to act")
            if not _same_origin(request):
                raise Refused("the request did not come from this dashboard's pages")
            form = await _form(request)
            if not same_token(form.get("csrf"), session["csrf"]):
                raise Refused("missing or wrong CSRF token")
            action = ACTIONS.get(name)
            if action is None:
                raise Refused(f"no action {name!r}", 404)
        except Refused as exc:
            log.warning("dashboard: refused %s: %s", name, exc)
            return _refusal(exc)
        actor = f"dashboard:{session['user']}"
        try:
            message = await action(client(), form, actor)
            log.info("dashboard: %s: %s", actor, message)
        except (BadForm, errors.InvalidArgument) as exc:
            message = f"Not done: {exc}"
        except errors.PermissionDenied as exc:
            role = "producer" if name in PRODUCER_ACTIONS else "admin"
            message = f"Not done: {_role_hint(exc, f'{settings.schema}_{role}')}"
        except _UNAVAILABLE as exc:
            # Every action is safe to send again: cancel, retry, signal and skip
            # replay by their call id, the others are idempotent.
            log.warning("dashboard: %s: %s not done: %s", actor, name, exc)
            why = present.error_summary(str(exc))
            message = (
                f"Not done: the database is busy or unreachable ({why}). "
                "Sending the same form again is safe: it is applied once."
            )
        session["flash"] = message
        target = _local(form.get("next"))
        return with_cookie(RedirectResponse(target, status_code=303), request, session)

    # -- the rest -------------------------------------------------------------------
    async def live(request: Request) -> Response:
        if not can_view(session_of(request)):
            return Response("log in first", status_code=403)
        return StreamingResponse(
            event_stream(notifications),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    async def health(_request: Request) -> Response:
        try:
            version = await client().get_schema_version()
        except (psycopg.Error, errors.RunrelayError) as exc:
            return JSONResponse({"ok": False, "error": str(exc)}, status_code=503)
        return JSONResponse(
            {"ok": True, "schema_version": version, "listening": notifications.listening}
        )

    routes = [
        Route("/", page("overview.html", overview)),
        Route("/runs", page("runs.html", runs)),
        Route("/run", page("run.html", run)),
        Route("/deliveries", page("deliveries.html", deliveries)),
        Route("/skip", page("skip.html", skip)),
        Route("/processes", page("processes.html", processes)),
        Route("/schedules", page("schedules.html", schedules)),
        Route("/login", login, methods=["GET", "POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/actions/{action}", act, methods=["POST"]),
        Route("/live", live),
        Route("/healthz", health),
        Mount("/static", StaticFiles(directory=os.path.join(HERE, "static")), name="static"),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.add_middleware(_SecurityHeaders)
    app.add_middleware(_ForwardedFrom, proxies=settings.trusted_proxies)
    app.add_middleware(_AllowedHosts, hosts=(*LOOPBACK_HOSTS, *settings.allowed_hosts))
    return app


# -- actions: each reads its form, makes one call, and says what happened -------------
Action = Callable[[AsyncClient, dict[str, str], str], Awaitable[str]]


async def _cancel(c: AsyncClient, form: dict[str, str], actor: str) -> str:
    run_id = _required(form, "run_id")
    reason = _text(form, "reason") or f"cancelled by {actor}"
    outcome = await c.cancel_run(run_id, reason=reason, call_id=_call_id(form))
    return f"Cancel {run_id}: {outcome}"


async def _retry(c: AsyncClient, form: dict[str, str], actor: str) -> str:
    run_id = _required(form, "run_id")
    outcome = await c.retry_run(
        run_id, reason=_text(form, "reason"), requested_by=actor, call_id=_call_id(form)
    )
    return f"Retry {run_id}: {outcome}"


async def _signal(c: AsyncClient, form: dict[str, str], actor: str) -> str:
    run_id = _required(form, "run_id")
    name = _required(form, "name")
    raw = form.get("payload") or "{}"
    try:
        payload = json.loads(raw)
    except ValueError as exc:
        raise BadForm(f"payload is not JSON ({exc})") from None
    outcome = await c.signal_run(run_id, name, payload, call_id=_call_id(form))
    return f"Signal {name!r} to {run_id}: {outcome}"


async def _requeue(c: AsyncClient, form: dict[str, str], actor: str) -> str:
    run_id = _text(form, "run_id")
    lane = _text(form, "lane")
    if lane is not None and lane not in LANES:
        raise BadForm(f"lane must be one of {', '.join(LANES)}")
    lanes = await c.requeue_blocked_heads(run_id=run_id, lane=lane)
    events = sum(r.requeued for r in lanes)
    what = f"{run_id} {lane or 'every lane'}" if run_id else "every blocked lane"
    return f"Requeue {what}: {events} event(s) in {len(lanes)} lane(s) requeued"


async def _skip(c: AsyncClient, form: dict[str, str], actor: str) -> str:
    """Only from the confirmation page (/skip): its form alone carries
    confirmed=yes. The login the dashboard connects as is kept on the event
    (skipped_by); the dashboard user goes into the reason."""
    run_id = _required(form, "run_id")
    lane = _required(form, "lane")
    if lane not in LANES:
        raise BadForm(f"lane must be one of {', '.join(LANES)}")
    if form.get("confirmed") != "yes":
        raise BadForm("a skip is confirmed on its own page: open it with Skip… on the row")
    reason = f"{_required(form, 'reason')} ({actor})"
    rows = await c.skip_ledger_events(run_id, lane, reason, call_id=_call_id(form))
    if not any(r.outcome == "skipped" for r in rows):
        return f"Skip {run_id} {lane}: not blocked, nothing skipped"
    return f"Skip {run_id} {lane}: the failed head skipped; the lane delivers its successors"


async def _pause(c: AsyncClient, form: dict[str, str], actor: str) -> str:
    queue = _required(form, "queue")
    outcome = await c.pause_queue(queue, reason=_text(form, "reason"), requested_by=actor)
    return f"Pause {queue}: {outcome}"


async def _resume(c: AsyncClient, form: dict[str, str], actor: str) -> str:
    queue = _required(form, "queue")
    outcome = await c.resume_queue(queue)
    return f"Resume {queue}: {outcome}"


ACTIONS: dict[str, Action] = {
    "cancel": _cancel,
    "retry": _retry,
    "signal": _signal,
    "requeue": _requeue,
    "skip": _skip,
    "pause": _pause,
    "resume": _resume,
}


# -- small helpers ------------------------------------------------------------------------
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


class LoginLimiter:
    """Failed logins counted per client address and in total over a sliding
    window, in the process: new connections do not reset it. While either
    count is at its limit, every login is refused, a right password too."""

    def __init__(self, per_address: int, total: int, window: float) -> None:
        self.per_address = per_address
        self.total = total
        self.window = window
        self._failures: list[tuple[float, str]] = []

    def _recent(self) -> list[tuple[float, str]]:
        cutoff = time.monotonic() - self.window
        self._failures = [(t, a) for t, a in self._failures if t > cutoff]
        return self._failures

    def blocked(self, address: str) -> bool:
        recent = self._recent()
        mine = sum(1 for _, a in recent if a == address)
        return mine >= self.per_address or len(recent) >= self.total

    def failed(self, address: str) -> None:
        self._recent().append((time.monotonic(), address))


class _Redirect(Exception):
    def __init__(self, target: str) -> None:
        super().__init__(target)
        self.target = target


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


def _here(request: Request) -> str:
    return request.url.path + (f"?{request.url.query}" if request.url.query else "")


def _local(target: str | None) -> str:
    """A redirect target on this site only: a path, never another host."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


def _same_origin(request: Request) -> bool:
    """The browser's word on where a POST came from: Origin when it sends one,
    else Sec-Fetch-Site. Old clients that send neither pass on the CSRF
    token alone."""
    origin = request.headers.get("origin")
    if origin is not None:
        return urllib.parse.urlsplit(origin).netloc == request.headers.get("host")
    return request.headers.get("sec-fetch-site") in (None, "same-origin", "none")


async def _form(request: Request) -> dict[str, str]:
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/x-www-form-urlencoded":
        raise Refused("send the form as application/x-www-form-urlencoded", 415)
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise Refused("the form is too large", 413)
    try:
        pairs = urllib.parse.parse_qsl(body.decode("utf-8"), keep_blank_values=True)
    except UnicodeDecodeError:
        raise Refused("the form is not UTF-8", 400) from None
    form: dict[str, str] = {}
    for key, value in pairs:
        form.setdefault(key, value)
    return form


def _refusal(exc: Refused) -> Response:
    html = (
        "<!doctype html><meta charset=utf-8><title>Refused</title>"
        f"<h1>Refused</h1><p>{escape(str(exc))}. Nothing was changed.</p>"
        '<p><a href="/">Back to the dashboard</a></p>'
    )
    return HTMLResponse(html, status_code=exc.status)


def _required(form: dict[str, str], field: str) -> str:
    value = (form.get(field) or "").strip()
    if not value:
        raise BadForm(f"{field} is required")
    return value


def _text(form: dict[str, str], field: str) -> str | None:
    value = (form.get(field) or "").strip()
    return value or None


def _call_id(form: dict[str, str]) -> uuid.UUID:
    raw = form.get("call_id")
    if not raw:
        raise BadForm("call_id is required (reload the page: its form is from an older version)")
    try:
        return uuid.UUID(raw)
    except ValueError:
        raise BadForm("call_id is not a uuid") from None


def _timestamp(raw: str | None) -> datetime | None:
    if not raw:
        return None
    try:
        return datetime.fromisoformat(raw)
    except ValueError:
        raise errors.InvalidArgument(f"after_at is not a timestamp: {raw!r}") from None


def _role_hint(exc: Exception, role: str) -> str:
    """What a refused call needs: the role whose function it is. Pages and most
    actions call admin functions; cancel and signal call producer ones."""
    return f"{exc}. The dashboard's database login needs {role} for this: grant it to the login."
