"""Logging in and out of the dashboard, and where a POST came from."""

from __future__ import annotations

import asyncio
import urllib.parse

from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response

from .sessions import COOKIE, password_matches, same_token
from .state import Dashboard, Refused, _form, _local, _refusal, log


async def login(d: Dashboard, request: Request) -> Response:
    session = d.session_of(request)
    next_url = _local(request.query_params.get("next"))
    if d.settings.password is None:
        return RedirectResponse(next_url, status_code=303)
    if request.method == "GET":
        return d.render(request, "login.html", session, next_url=next_url, failed=False)
    try:
        form = await _form(request)
    except Refused as exc:
        return _refusal(exc)
    next_url = _local(form.get("next"))
    if not same_token(form.get("csrf"), session["csrf"]):
        return _refusal(Refused("the login form expired or was not this dashboard's; reload it"))
    peer = request.client.host if request.client else ""
    if d.limiter.blocked(peer):
        log.warning("dashboard: login from %s refused: too many failed logins", peer)
        return PlainTextResponse("too many failed logins; try again later", status_code=429)
    name = (form.get("name") or "").strip()
    if not name or not password_matches(form.get("password") or "", d.settings.password):
        d.limiter.failed(peer)
        await asyncio.sleep(0.5)  # slows a guesser down; a person barely notices
        log.warning("dashboard: failed login for %r", name)
        return d.render(request, "login.html", session, 401, next_url=next_url, failed=True)
    # A new session (and a new CSRF token) at every login.
    fresh = d.sessions.new()
    fresh["user"] = name[:100]
    log.info("dashboard: %s logged in", fresh["user"])
    return d.with_cookie(RedirectResponse(next_url, status_code=303), request, fresh)


async def logout(d: Dashboard, request: Request) -> Response:
    session = d.sessions.load(request.cookies.get(COOKIE))
    try:
        form = await _form(request)
    except Refused as exc:
        return _refusal(exc)
    if session is None or not same_token(form.get("csrf"), session["csrf"]):
        return _refusal(Refused("missing or wrong CSRF token"))
    d.sessions.revoke(session)
    return d.with_cookie(RedirectResponse("/login", status_code=303), request, d.sessions.new())


def _same_origin(request: Request) -> bool:
    """The browser's word on where a POST came from: Origin when it sends one,
    else Sec-Fetch-Site. Old clients that send neither pass on the CSRF
    token alone."""
    origin = request.headers.get("origin")
    if origin is not None:
        return urllib.parse.urlsplit(origin).netloc == request.headers.get("host")
    return request.headers.get("sec-fetch-site") in (None, "same-origin", "none")
