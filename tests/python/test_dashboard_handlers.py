"""The dashboard's handlers called alone: a handler is a function of the
application state and a request, so it can be tested without a server.

These calls need no database: the state's client is never set, and a
handler that reached for it would fail with RuntimeError. The pages and
actions against a real database are tests/python/test_dashboard.py.
"""

from __future__ import annotations

import asyncio
import urllib.parse
from typing import Any

import pytest
from starlette.requests import Request
from starlette.responses import Response

from runrelay.dashboard import actions, auth, pages
from runrelay.dashboard.sessions import COOKIE
from runrelay.dashboard.state import Dashboard, DashboardSettings


def _request(
    method: str,
    path: str,
    *,
    form: dict[str, str] | None = None,
    cookie: str | None = None,
    path_params: dict[str, str] | None = None,
) -> Request:
    body = urllib.parse.urlencode(form or {}).encode()
    headers = [(b"host", b"127.0.0.1:8787")]
    if form is not None:
        headers.append((b"content-type", b"application/x-www-form-urlencoded"))
    if cookie is not None:
        headers.append((b"cookie", f"{COOKIE}={cookie}".encode()))
    scope: dict[str, Any] = {
        "type": "http",
        "method": method,
        "path": path,
        "query_string": b"",
        "headers": headers,
        "scheme": "http",
        "server": ("127.0.0.1", 8787),
        "client": ("127.0.0.1", 50000),
        "path_params": path_params or {},
    }
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return Request(scope, receive)


def _state(**settings: Any) -> Dashboard:
    return Dashboard(DashboardSettings(database_url="postgresql://nowhere/none", **settings))


def _run(response: Any) -> Response:
    return asyncio.run(response)  # type: ignore[no-any-return]


def test_an_action_on_a_read_only_dashboard_is_refused_before_the_database() -> None:
    d = _state(password="pw")
    session = d.sessions.new()
    session["user"] = "ops"
    request = _request(
        "POST",
        "/actions/cancel",
        form={"csrf": session["csrf"], "run_id": "r1", "call_id": "x"},
        cookie=d.sessions.dump(session),
        path_params={"action": "cancel"},
    )
    response = _run(actions.act(d, request))
    assert response.status_code == 403
    assert b"read-only" in bytes(response.body)
    with pytest.raises(RuntimeError, match="has not started"):
        _ = d.client


def test_an_action_without_a_login_is_refused() -> None:
    d = _state(password="pw", read_write=True)
    session = d.sessions.new()  # not logged in
    request = _request(
        "POST",
        "/actions/retry",
        form={"csrf": session["csrf"], "run_id": "r1"},
        cookie=d.sessions.dump(session),
        path_params={"action": "retry"},
    )
    response = _run(actions.act(d, request))
    assert response.status_code == 403
    assert b"log in to act" in bytes(response.body)


def test_the_login_page_renders_and_a_wrong_password_is_401() -> None:
    d = _state(password="right")
    page = _run(auth.login(d, _request("GET", "/login")))
    assert page.status_code == 200
    assert b'name="password"' in bytes(page.body)

    session = d.sessions.new()
    wrong = _request(
        "POST",
        "/login",
        form={"csrf": session["csrf"], "name": "ops", "password": "wrong"},
        cookie=d.sessions.dump(session),
    )
    assert _run(auth.login(d, wrong)).status_code == 401
    right = _request(
        "POST",
        "/login",
        form={"csrf": session["csrf"], "name": "ops", "password": "right"},
        cookie=d.sessions.dump(session),
    )
    response = _run(auth.login(d, right))
    assert response.status_code == 303
    assert COOKIE in response.headers["set-cookie"]


def test_a_page_behind_a_password_sends_a_visitor_to_the_login() -> None:
    d = _state(password="pw")
    handler = pages.page(d, "runs.html", pages.runs)
    response = _run(handler(_request("GET", "/runs")))
    assert response.status_code == 303
    assert response.headers["location"] == "/login?next=%2Fruns"
