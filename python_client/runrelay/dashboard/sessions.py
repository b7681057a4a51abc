"""The dashboard's sessions: a signed cookie, and the CSRF token it carries.

A session is a small JSON object in one cookie, signed with HMAC-SHA256 under
the dashboard's secret, so the server keeps no session state and a browser
cannot edit its own. It holds:

* ``csrf`` — a random token, made when the session starts. Every form of the
  dashboard carries it in a hidden field, and every POST must send it back
  (compared in constant time). A page of another site can make the browser
  send the cookie but cannot read the token, so it cannot forge an action.
* ``user`` — the name given at login, or absent: not logged in.
* ``exp`` — when the session ends (Unix seconds); an expired cookie is no
  session at all.
* ``flash`` — a one-line message for the next page (what an action did).
* ``sid`` — a random id of this session, so that logging out can end it on
  the server: the id is remembered as revoked until the cookie would have
  expired, and a replayed copy of the cookie is no session.

The signing key is derived from the secret and from the dashboard password,
so changing the password ends every session at once, even with the same
secret. Revoked ids live in the process: a restart with a configured secret
forgets them (a logged-out cookie replayed after a restart works again until
it expires); change the password to end them all.

The cookie is HttpOnly and SameSite=Lax (and Secure behind https): scripts
cannot read it, and browsers do not send it with another site's POSTs. Lax
rather than Strict so that a link to a run, followed from chat or email,
opens logged in; the token is the defence that does not depend on the
browser either way.
Without a configured secret (RUNRELAY_DASHBOARD_SECRET) the process makes a
random one, and restarting it logs everybody out.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
import time
from typing import Any

COOKIE = "runrelay_session"
# How long a session lasts after login (or after its first page).
MAX_AGE_SECONDS = 12 * 3600


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Sessions:
    """Signs and reads session cookies with one secret."""

    def __init__(
        self, secret: bytes, max_age: int = MAX_AGE_SECONDS, *, password: str | None = None
    ) -> None:
        if len(secret) < 16:
            raise ValueError("the session secret must be at least 16 bytes")
        # The password is part of the key: a new password, a new epoch.
        epoch = hashlib.sha256((password or "").encode()).digest()
        self._key = hashlib.sha256(b"runrelay-dashboard-session\0" + secret + epoch).digest()
        self.max_age = max_age
        self._revoked: dict[str, int] = {}

    def new(self) -> dict[str, Any]:
        """A fresh anonymous session with its own CSRF token and id."""
        return {
            "csrf": secrets.token_urlsafe(32),
            "sid": secrets.token_urlsafe(16),
            "exp": int(time.time()) + self.max_age,
        }

    def revoke(self, session: dict[str, Any]) -> None:
        """End `session` on the server: its cookie, replayed, is no session."""
        now = time.time()
        for old, expires in list(self._revoked.items()):
            if expires <= now:
                del self._revoked[old]
        sid = session.get("sid")
        if isinstance(sid, str):
            self._revoked[sid] = int(session.get("exp") or now + self.max_age)

    def dump(self, session: dict[str, Any]) -> str:
        body = _b64(json.dumps(session, separators=(",", ":"), sort_keys=True).encode())
        return body + "." + _b64(self._sign(body))

    def load(self, cookie: str | None) -> dict[str, Any] | None:
        """The session a cookie holds, or None: absent, forged, altered or expired."""
        if not cookie or cookie.count(".") != 1:
            return None
        body, signature = cookie.split(".")
        try:
            given = _unb64(signature)
            data = json.loads(_unb64(body))
        except (binascii.Error, ValueError):
            return None
        if not hmac.compare_digest(given, self._sign(body)):
            return None
        if not isinstance(data, dict) or not isinstance(data.get("csrf"), str):
            return None
        expires = data.get("exp")
        if not isinstance(expires, int) or expires <= time.time():
            return None
        if not isinstance(data.get("sid"), str) or data["sid"] in self._revoked:
            return None
        return data

    def _sign(self, body: str) -> bytes:
        return hmac.new(self._key, body.encode("ascii"), hashlib.sha256).digest()


def same_token(given: object, expected: str) -> bool:
    """Whether a form's CSRF token is the session's, in constant time."""
    return isinstance(given, str) and hmac.compare_digest(given.encode(), expected.encode())


def password_matches(given: str, expected: str) -> bool:
    """Compare passwords by their digests, so the time taken tells nothing of
    either's length or content."""
    a = hashlib.sha256(given.encode()).digest()
    b = hashlib.sha256(expected.encode()).digest()
    return hmac.compare_digest(a, b)


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
