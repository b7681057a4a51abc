"""The dashboard's application state, one object every handler is given:
how it was started (DashboardSettings), its sessions, its login limiter, its
templates, the live notifications and the database client; and what every
handler does with them: the session of a request, who may view or act,
rendering a page, and reading and refusing a form.

The handlers are module-level functions of (state, request) in pages.py,
auth.py and actions.py; app.py binds them to routes. So a handler can be
called alone, with a state made for it.
"""

from __future__ import annotations

import logging
import os
import secrets
import urllib.parse
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import jinja2
import psycopg
from markupsafe import escape
from psycopg_pool import PoolTimeout
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from .. import errors
from ..client import AsyncClient
from ..types import RunStatus
from . import present
from .live import Notifications
from .sessions import COOKIE, LoginLimiter, Sessions

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


class Redirect(Exception):
    """A page that answers with a redirect (303) instead of rendering."""

    def __init__(self, target: str) -> None:
        super().__init__(target)
        self.target = target


class Dashboard:
    """The application state of one dashboard. `client` is set when the app
    starts (its lifespan opens the pool) and is the database for every
    handler."""

    def __init__(self, settings: DashboardSettings) -> None:
        if settings.read_write and not settings.password:
            raise ValueError(
                "a read-write dashboard needs a password (RUNRELAY_DASHBOARD_PASSWORD): "
                "actions are only taken for a logged-in session"
            )
        self.settings = settings
        self.sessions = Sessions(
            settings.secret or secrets.token_bytes(32), password=settings.password
        )
        self.limiter = LoginLimiter(
            settings.login_attempts, settings.login_attempts_total, settings.login_window
        )
        self.templates = jinja2.Environment(
            loader=jinja2.FileSystemLoader(os.path.join(HERE, "templates")),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
        )
        self.templates.filters.update(
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
        self.notifications = Notifications(settings.database_url, settings.schema)
        self._client: AsyncClient | None = None

    @property
    def client(self) -> AsyncClient:
        if self._client is None:
            raise RuntimeError("the dashboard has no database client: it has not started")
        return self._client

    @client.setter
    def client(self, client: AsyncClient) -> None:
        self._client = client

    def session_of(self, request: Request) -> dict[str, Any]:
        return self.sessions.load(request.cookies.get(COOKIE)) or self.sessions.new()

    def can_view(self, session: dict[str, Any]) -> bool:
        return self.settings.password is None or bool(session.get("user"))

    def can_act(self, session: dict[str, Any]) -> bool:
        return (
            self.settings.read_write
            and self.settings.password is not None
            and bool(session.get("user"))
        )

    def with_cookie(
        self, response: Response, request: Request, session: dict[str, Any]
    ) -> Response:
        response.set_cookie(
            COOKIE,
            self.sessions.dump(session),
            max_age=self.sessions.max_age,
            httponly=True,
            samesite="lax",
            secure=request.url.scheme == "https",
            path="/",
        )
        return response

    def render(
        self,
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
        html = self.templates.get_template(template).render(
            request=request,
            page=template.removesuffix(".html"),
            user=session.get("user"),
            can_act=self.can_act(session),
            read_write=self.settings.read_write,
            needs_login=self.settings.password is not None,
            csrf=session["csrf"],
            flash=flash,
            now=datetime.now(UTC),
            new_call_id=lambda: str(uuid.uuid4()),
            here=_here(request),
            **context,
        )
        response = HTMLResponse(html, status_code=status)
        return response if refresh else self.with_cookie(response, request, session)

    def to_login(self, request: Request) -> Response:
        target = "/login?" + urllib.parse.urlencode({"next": _here(request)})
        return RedirectResponse(target, status_code=303)


def _here(request: Request) -> str:
    return request.url.path + (f"?{request.url.query}" if request.url.query else "")


def _local(target: str | None) -> str:
    """A redirect target on this site only: a path, never another host."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


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


def _role_hint(exc: Exception, role: str) -> str:
    """What a refused call needs: the role whose function it is. Pages and most
    actions call admin functions; cancel and signal call producer ones."""
    return f"{exc}. The dashboard's database login needs {role} for this: grant it to the login."
