"""Waiting between retries, and which errors call for a retry.

Every loop that retries after the database failed it (a claim, a relay call,
a lost LISTEN connection, a whole round of the Worker, Relay or Maintenance
loop) waits a *full jitter* delay: uniform between 0 and
min(cap, base * 2**n) after the n-th consecutive failure. Processes that lost
the database together therefore come back spread out instead of in lock-step,
and a process never retries in a busy loop (the cap bounds the wait, the
growth bounds the rate).

The LISTEN sessions that reconnect with this backoff are runrelay._listen.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable

import psycopg

from .errors import ERRORS

# The errors after which a loop repeats its call with backoff, because the
# database (or a part of it) was away rather than the call wrong: a lost or
# refused connection (class 08, which psycopg raises as OperationalError),
# and XX000, which PL/Proxy raises when it cannot reach a shard ("PL/Proxy
# function ...: PQconnectPoll: connection ... failed"); through a sharding
# proxy a call whose shard is down answers 08006. Every loop call is safe to
# repeat (claims replay by call_id, fenced writes are idempotent).
_TRANSIENT: tuple[type[BaseException], ...] = (
    psycopg.OperationalError,
    psycopg.InterfaceError,
    psycopg.errors.InternalError_,
    *(cls for cls in ERRORS if str(cls.sqlstate).startswith("08") or cls.sqlstate == "XX000"),
)

try:  # the pool is a dependency, but a caller may pass plain connections
    from psycopg_pool import PoolTimeout

    CONNECTION_ERRORS: tuple[type[BaseException], ...] = (*_TRANSIENT, PoolTimeout)
except ImportError:  # pragma: no cover - psycopg_pool is a declared dependency
    CONNECTION_ERRORS = _TRANSIENT


def full_jitter(
    failures: int, base: float, cap: float, rng: Callable[[], float] = random.random
) -> float:
    """The delay after `failures` consecutive failures (0 for the first
    retry's exponent): uniform in [0, min(cap, base * 2**failures)]."""
    if failures < 0 or base < 0 or cap < 0:
        raise ValueError("failures, base and cap must not be negative")
    ceiling = min(cap, base * 2.0 ** min(failures, 62))
    return rng() * ceiling


def jittered(
    interval: float, spread: float = 0.5, rng: Callable[[], float] = random.random
) -> float:
    """`interval` moved by up to ±spread of itself, so periodic loops started
    together drift apart: uniform in [interval*(1-spread), interval*(1+spread)]."""
    if interval < 0 or not 0 <= spread <= 1:
        raise ValueError("interval must not be negative and spread must be within [0, 1]")
    return interval * (1.0 - spread + 2.0 * spread * rng())


class Backoff:
    """Consecutive-failure counter that hands out full-jitter delays."""

    def __init__(
        self, base: float = 0.1, cap: float = 10.0, rng: Callable[[], float] = random.random
    ) -> None:
        if base <= 0 or cap < base:
            raise ValueError("need 0 < base <= cap")
        self.base = base
        self.cap = cap
        self.failures = 0
        self._rng = rng

    def next(self) -> float:
        """The delay before the next retry; counts one more failure."""
        delay = full_jitter(self.failures, self.base, self.cap, self._rng)
        self.failures += 1
        return delay

    def reset(self) -> None:
        """A call succeeded: the next failure starts from `base` again."""
        self.failures = 0


async def wait_event(event: asyncio.Event, timeout: float) -> None:
    """Until `event` is set or `timeout` seconds passed."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), timeout=max(0.0, timeout))


def first_line(exc: BaseException) -> str:
    """The first line of an error's text, for one-line log messages."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
