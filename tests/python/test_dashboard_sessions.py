"""The dashboard's session cookies: a browser cannot forge, edit or extend
one, and CSRF tokens and passwords are compared in constant time."""

from __future__ import annotations

import base64
import json
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from runrelay.dashboard import DashboardSettings, Running
from runrelay.dashboard import start as start_dashboard
from runrelay.dashboard.sessions import COOKIE, Sessions, password_matches, same_token

SECRET = b"s" * 32


def test_a_session_survives_the_round_trip() -> None:
    sessions = Sessions(SECRET)
    session = sessions.new()
    session["user"] = "ana"
    assert sessions.load(sessions.dump(session)) == session


def test_each_session_has_its_own_csrf_token() -> None:
    sessions = Sessions(SECRET)
    assert sessions.new()["csrf"] != sessions.new()["csrf"]


def _edited(cookie: str, **changes: object) -> str:
    body, signature = cookie.split(".")
    data = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    data.update(changes)
    raw = json.dumps(data, separators=(",", ":"), sort_keys=True).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode() + "." + signature


def test_an_edited_cookie_is_no_session() -> None:
    sessions = Sessions(SECRET)
    cookie = sessions.dump(sessions.new())
    assert sessions.load(_edited(cookie, user="mallory")) is None
    assert sessions.load(_edited(cookie, exp=int(time.time()) + 10**9)) is None


def test_a_cookie_signed_with_another_secret_is_no_session() -> None:
    other = Sessions(b"o" * 32)
    assert Sessions(SECRET).load(other.dump({**other.new(), "user": "mallory"})) is None


def test_an_expired_session_is_no_session() -> None:
    sessions = Sessions(SECRET, max_age=-1)
    assert sessions.load(sessions.dump(sessions.new())) is None


@pytest.mark.parametrize(
    "cookie", [None, "", "x", "a.b.c", "!!!.???", "e30.AAAA", "bm90IGpzb24.AAAA"]
)
def test_garbage_is_no_session(cookie: str | None) -> None:
    assert Sessions(SECRET).load(cookie) is None


def test_a_short_secret_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 16 bytes"):
        Sessions(b"short")


def test_tokens_and_passwords_match_only_exactly() -> None:
    assert same_token("abc", "abc")
    assert not same_token("abd", "abc")
    assert not same_token(None, "abc")
    assert not same_token(["abc"], "abc")
    assert password_matches("hunter2", "hunter2")
    assert not password_matches("hunter2 ", "hunter2")
    assert not password_matches("", "hunter2")


def test_logging_out_ends_the_session_even_if_its_cookie_is_replayed() -> None:
    sessions = Sessions(SECRET, password="pw")
    session = {**sessions.new(), "user": "ana"}
    cookie = sessions.dump(session)
    sessions.revoke(session)
    assert sessions.load(cookie) is None


def test_a_changed_password_ends_every_session() -> None:
    cookie = Sessions(SECRET, password="old").dump({**Sessions(SECRET).new(), "user": "ana"})
    assert Sessions(SECRET, password="old").load(cookie) is not None
    assert Sessions(SECRET, password="new").load(cookie) is None


# -- against a real server -----------------------------------------------------------
PASSWORD = "the right password"


@pytest.fixture
def served(db_url: str) -> Iterator[Callable[..., str]]:
    """Start a real dashboard (uvicorn on 127.0.0.1) with given settings;
    returns its base URL."""
    running: list[Running] = []

    def start(**options: Any) -> str:
        settings = DashboardSettings(
            db_url, password=options.pop("password", PASSWORD), secret=SECRET, **options
        )
        running.append(start_dashboard(settings))
        return running[-1].url.rstrip("/")

    yield start
    for server in running:
        server.stop()


def _csrf(client: httpx.Client, base: str) -> str:
    page = client.get(f"{base}/login")
    assert page.status_code == 200, page.text
    found = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert found is not None
    return found.group(1)


def _login(client: httpx.Client, base: str, password: str) -> httpx.Response:
    token = _csrf(client, base)
    return client.post(
        f"{base}/login",
        data={"csrf": token, "next": "/", "name": "ana", "password": password},
        headers={"origin": base},
    )


def test_a_host_not_allowed_gets_400_and_nothing(served: Callable[..., str]) -> None:
    base = served(password=None)
    assert httpx.get(f"{base}/login", follow_redirects=False).status_code in (200, 303)
    assert httpx.get(f"{base}/login", headers={"host": "localhost"}).status_code != 400
    rebound = httpx.get(f"{base}/", headers={"host": "attacker.example"})
    assert rebound.status_code == 400
    assert "runrelay" not in rebound.text.lower()
    assert rebound.text == "unknown Host"


def test_an_allowed_host_is_served(served: Callable[..., str]) -> None:
    base = served(password=None, allowed_hosts=("dash.example.com",))
    page = httpx.get(f"{base}/login", headers={"host": "dash.example.com:8787"})
    assert page.status_code != 400
    assert httpx.get(f"{base}/", headers={"host": "other.example.com"}).status_code == 400


def test_failed_logins_over_new_connections_lock_out_even_the_right_password(
    served: Callable[..., str],
) -> None:
    base = served(login_attempts=3, login_window=3.0)
    for _ in range(3):
        with httpx.Client() as fresh:  # a new connection each time
            assert _login(fresh, base, "wrong").status_code == 401
    with httpx.Client() as fresh:
        refused = _login(fresh, base, PASSWORD)
        assert refused.status_code == 429
        assert COOKIE not in refused.cookies
    time.sleep(3.1)  # the configured window, no longer
    with httpx.Client() as fresh:
        assert _login(fresh, base, PASSWORD).status_code == 303


def test_a_logged_out_cookie_replayed_is_no_session(served: Callable[..., str]) -> None:
    base = served()
    with httpx.Client() as browser:
        assert _login(browser, base, PASSWORD).status_code == 303
        cookie = browser.cookies[COOKIE]
        home = browser.get(f"{base}/", follow_redirects=False)
        assert home.status_code != 303
        token = re.search(r'name="csrf" value="([^"]+)"', home.text)
        assert token is not None
        out = browser.post(
            f"{base}/logout", data={"csrf": token.group(1)}, headers={"origin": base}
        )
        assert out.status_code == 303
    replay = httpx.get(f"{base}/", cookies={COOKIE: cookie}, follow_redirects=False)
    assert replay.status_code == 303
    assert replay.headers["location"].startswith("/login")


def test_a_new_password_ends_the_sessions_made_under_the_old_one(
    served: Callable[..., str],
) -> None:
    old = served(password="old password")
    with httpx.Client() as browser:
        assert _login(browser, old, "old password").status_code == 303
        cookie = browser.cookies[COOKIE]
    assert httpx.get(f"{old}/", cookies={COOKIE: cookie}, follow_redirects=False).status_code == 200
    new = served(password="new password")  # same secret, a restart with a new password
    replay = httpx.get(f"{new}/", cookies={COOKIE: cookie}, follow_redirects=False)
    assert replay.status_code == 303


def _login_cookie_header(base: str, headers: dict[str, str]) -> str:
    """The session cookie the login page sets."""
    response = httpx.get(f"{base}/login", headers=headers)
    assert response.status_code == 200, response.text
    return str(response.headers["set-cookie"])


def test_the_cookie_is_secure_behind_a_trusted_tls_proxy_only(
    served: Callable[..., str],
) -> None:
    https = {"x-forwarded-proto": "https", "x-forwarded-for": "203.0.113.9"}
    untrusted = served()
    assert "secure" not in _login_cookie_header(untrusted, https).lower()
    trusted = served(trusted_proxies=("127.0.0.1",))
    assert "secure" in _login_cookie_header(trusted, https).lower()
    assert "secure" not in _login_cookie_header(trusted, {}).lower()


def test_a_trusted_proxy_keys_the_login_limit_by_the_forwarded_address(
    served: Callable[..., str],
) -> None:
    base = served(trusted_proxies=("127.0.0.1",), login_attempts=2, login_window=60.0)
    for _ in range(2):
        with httpx.Client(headers={"x-forwarded-for": "203.0.113.9"}) as fresh:
            assert _login(fresh, base, "wrong").status_code == 401
    with httpx.Client(headers={"x-forwarded-for": "203.0.113.9"}) as fresh:
        assert _login(fresh, base, PASSWORD).status_code == 429
    with httpx.Client(headers={"x-forwarded-for": "198.51.100.7"}) as other:
        assert _login(other, base, PASSWORD).status_code == 303
