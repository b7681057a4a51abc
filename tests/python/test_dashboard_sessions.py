"""The dashboard's session cookies: a browser cannot forge, edit or extend
one, and CSRF tokens and passwords are compared in constant time."""

from __future__ import annotations

import base64
import json
import time

import pytest

from runrelay.dashboard.sessions import Sessions, password_matches, same_token

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
