"""Waiting between retries, and the LISTEN connections that reconnect with it.

Every loop that retries after the database failed it (a claim, a relay call,
a lost LISTEN connection, a whole round of the Worker, Relay or Maintenance
loop) waits a *full jitter* delay: uniform between 0 and
min(cap, base * 2**n) after the n-th consecutive failure. Processes that lost
the database together therefore come back spread out instead of in lock-step,
and a process never retries in a busy loop (the cap bounds the wait, the
growth bounds the rate).

`Listener` / `AsyncListener` hold the LISTEN session of a loop. A lost
connection is logged once and reconnected with the same backoff; until it is
back the loop sleeps its poll timeout, so wake-ups degrade to polling for the
outage only, never for good.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg

log = logging.getLogger("runrelay.backoff")

try:  # the pool is a dependency, but a caller may pass plain connections
    from psycopg_pool import PoolTimeout

    CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
        psycopg.OperationalError,
        psycopg.InterfaceError,
        PoolTimeout,
    )
except ImportError:  # pragma: no cover - psycopg_pool is a declared dependency
    CONNECTION_ERRORS = (psycopg.OperationalError, psycopg.InterfaceError)


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


# How often a blocking LISTEN wait looks at its stop event.
STOP_CHECK = 0.5


class Listener:
    """A LISTEN session on one channel that reconnects after losing its
    connection. `wait(timeout, stop)` returns after a notification, the
    timeout, or stop being set — whichever comes first."""

    def __init__(self, dsn: str, channel: str, *, backoff: Backoff | None = None) -> None:
        self.dsn = dsn
        self.channel = channel
        self.backoff = backoff or Backoff(base=0.2, cap=30.0)
        self.conn: psycopg.Connection[Any] | None = None
        self._retry_at = 0.0

    def _connect(self) -> None:
        if time.monotonic() < self._retry_at:
            return
        try:
            conn = psycopg.connect(self.dsn, autocommit=True)
            conn.execute(f"LISTEN {self.channel}")
        except psycopg.Error as exc:
            delay = self.backoff.next()
            self._retry_at = time.monotonic() + delay
            log.warning(
                "LISTEN %s unavailable (%s); polling, retrying in %.1fs",
                self.channel,
                first_line(exc),
                delay,
            )
            return
        self.conn = conn
        if self.backoff.failures:
            log.info("LISTEN %s connection is back", self.channel)
        self.backoff.reset()

    def wait(self, timeout: float, stop: threading.Event) -> None:
        if self.conn is None:
            self._connect()
        if self.conn is None:
            stop.wait(timeout)
            return
        # In slices, so that stop() (set from another thread or a signal
        # handler) ends the wait within STOP_CHECK seconds, not the timeout.
        deadline = time.monotonic() + timeout
        try:
            while not stop.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                for _ in self.conn.notifies(timeout=min(left, STOP_CHECK), stop_after=1):
                    return
        except psycopg.Error as exc:
            self._lost(exc)
            stop.wait(min(timeout, max(0.0, self._retry_at - time.monotonic())))

    def _lost(self, exc: BaseException) -> None:
        self.close()
        delay = self.backoff.next()
        self._retry_at = time.monotonic() + delay
        log.warning(
            "LISTEN %s connection lost (%s); reconnecting in %.1fs",
            self.channel,
            first_line(exc),
            delay,
        )

    def close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                conn.close()


class AsyncListener:
    """Listener on a psycopg AsyncConnection, for the asyncio loops."""

    def __init__(self, dsn: str, channel: str, *, backoff: Backoff | None = None) -> None:
        self.dsn = dsn
        self.channel = channel
        self.backoff = backoff or Backoff(base=0.2, cap=30.0)
        self.conn: psycopg.AsyncConnection[Any] | None = None
        self._retry_at = 0.0

    async def _connect(self) -> None:
        if time.monotonic() < self._retry_at:
            return
        try:
            conn = await psycopg.AsyncConnection.connect(self.dsn, autocommit=True)
            await conn.execute(f"LISTEN {self.channel}")
        except psycopg.Error as exc:
            delay = self.backoff.next()
            self._retry_at = time.monotonic() + delay
            log.warning(
                "LISTEN %s unavailable (%s); polling, retrying in %.1fs",
                self.channel,
                first_line(exc),
                delay,
            )
            return
        self.conn = conn
        if self.backoff.failures:
            log.info("LISTEN %s connection is back", self.channel)
        self.backoff.reset()

    async def wait(self, timeout: float, stop: asyncio.Event) -> None:
        if self.conn is None:
            await self._connect()
        if self.conn is None:
            await wait_event(stop, timeout)
            return
        notified = asyncio.ensure_future(self._one_notify(self.conn, timeout))
        stopped = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({notified, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
        if not notified.done():
            # stop() was called: abandon the wait. Cancelling a pending
            # notifies() leaves the connection unusable, so close it; a
            # stopped loop does not wait again.
            notified.cancel()
            await asyncio.gather(notified, return_exceptions=True)
            await self.close()
            return
        exc = notified.exception()
        if isinstance(exc, psycopg.Error):
            await self._lost(exc)
            await wait_event(stop, min(timeout, max(0.0, self._retry_at - time.monotonic())))
        elif exc is not None:
            raise exc

    @staticmethod
    async def _one_notify(conn: psycopg.AsyncConnection[Any], timeout: float) -> None:
        async for _ in conn.notifies(timeout=timeout, stop_after=1):
            pass

    async def _lost(self, exc: BaseException) -> None:
        await self.close()
        delay = self.backoff.next()
        self._retry_at = time.monotonic() + delay
        log.warning(
            "LISTEN %s connection lost (%s); reconnecting in %.1fs",
            self.channel,
            first_line(exc),
            delay,
        )

    async def close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                await conn.close()


async def wait_event(event: asyncio.Event, timeout: float) -> None:
    """Until `event` is set or `timeout` seconds passed."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), timeout=max(0.0, timeout))


def first_line(exc: BaseException) -> str:
    """The first line of an error's text, for one-line log messages."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
