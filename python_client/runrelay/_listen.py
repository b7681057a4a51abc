"""The LISTEN connections of the loops, reconnecting with backoff.

`Listener` / `AsyncListener` hold the LISTEN session of a loop. A lost
connection is logged once and reconnected with the backoff of
runrelay._backoff; until it is back the loop sleeps its poll timeout, so
wake-ups degrade to polling for the outage only, never for good. A session
that (re)connects wakes the loop once: a NOTIFY sent while no session
listened is lost, so the loop looks again.

`MultiListener` / `AsyncMultiListener` listen on several servers at once —
the shards of a sharded install, where a NOTIFY is sent on the shard that
holds the run and reaches no other server (PL/Proxy does not relay it). Each
server has its own Listener in its own thread (task), so one that is down
reconnects with its own backoff and delays no other. `make_listener` picks
the kind a loop's `listen_dsn` calls for.

The channels' names are `runrelay.contract.channel(schema, kind)`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
from psycopg import conninfo, sql

from ._backoff import Backoff, first_line, wait_event

log = logging.getLogger("runrelay.listen")

# What a loop's listen_dsn may be: one DSN, several (a sharded install's
# shards), or a callable returning the current DSNs (asked again every
# REFRESH seconds, so shards added to or removed from a proxy's map are
# followed).
ListenDsn = str | Sequence[str] | Callable[[], Sequence[str]]

REFRESH = 30.0

_BARE_NAME = re.compile(r"[a-z_][a-z0-9_]*")


def listen_statement(channel_name: str) -> sql.SQL | sql.Composed:
    """LISTEN on a channel. A name PostgreSQL reads as it is written
    (lowercase letter or _, then lowercase letters, digits, _) goes bare, so
    the default install's session shows `LISTEN runrelay_runs` in
    pg_stat_activity; any other is quoted as an identifier (a schema such as
    2024billing gives `LISTEN "2024billing_runs"`). A channel name always
    ends in _runs, _ledger, _terminal or _delivered, so it is never a keyword."""
    if _BARE_NAME.fullmatch(channel_name):
        return sql.SQL(f"LISTEN {channel_name}")
    return sql.SQL("LISTEN {}").format(sql.Identifier(channel_name))


# How often a blocking LISTEN wait looks at its stop event.
STOP_CHECK = 0.5


class _Session:
    """A LISTEN session's state and decisions, shared by Listener and
    AsyncListener: when to try to connect again, and what a failure means.
    The shells own the connection and the waiting."""

    conn: Any

    def __init__(
        self,
        dsn: str,
        channel: str,
        *,
        backoff: Backoff | None = None,
        on_notify: Callable[[str], None] | None = None,
    ) -> None:
        self.dsn = dsn
        self.channel = channel
        self.backoff = backoff or Backoff(base=0.2, cap=30.0)
        # Called with each notification's payload, for channels whose
        # payload says more than "look again" (<schema>_cancel).
        self.on_notify = on_notify
        self.conn = None
        self._retry_at = 0.0
        # How log lines name this session: the channel, and the server when
        # it is one of several (MultiListener).
        self.label = channel

    def _may_connect(self) -> bool:
        return time.monotonic() >= self._retry_at

    def _unavailable(self, exc: BaseException) -> None:
        delay = self.backoff.next()
        self._retry_at = time.monotonic() + delay
        log.warning(
            "LISTEN %s unavailable (%s); polling, retrying in %.1fs",
            self.label,
            first_line(exc),
            delay,
        )

    def _connected(self, conn: Any) -> None:
        self.conn = conn
        if self.backoff.failures:
            log.info("LISTEN %s connection is back", self.label)
        self.backoff.reset()

    def _dropped(self, exc: BaseException) -> None:
        """The connection was lost (the shell closed it): reconnect after a
        backoff."""
        delay = self.backoff.next()
        self._retry_at = time.monotonic() + delay
        log.warning(
            "LISTEN %s connection lost (%s); reconnecting in %.1fs",
            self.label,
            first_line(exc),
            delay,
        )

    def _notified(self, payload: str) -> None:
        if self.on_notify is not None:
            self.on_notify(payload)

    def _until_retry(self, timeout: float) -> float:
        """How long a wait without a connection sleeps: until the backoff
        lets it connect again, at most `timeout`."""
        return min(timeout, max(0.0, self._retry_at - time.monotonic()))


class Listener(_Session):
    """A LISTEN session on one channel that reconnects after losing its
    connection. `wait(timeout, stop)` returns after a notification, the
    timeout, or stop being set — whichever comes first; True when it was a
    notification or the session was just (re)established (a NOTIFY sent
    while none listened is lost: look again for work)."""

    conn: psycopg.Connection[Any] | None

    def _connect(self) -> bool:
        if not self._may_connect():
            return False
        try:
            conn = psycopg.connect(self.dsn, autocommit=True)
            conn.execute(listen_statement(self.channel))
        except psycopg.Error as exc:
            self._unavailable(exc)
            return False
        self._connected(conn)
        return True

    def wait(self, timeout: float, stop: threading.Event) -> bool:
        if self.conn is None:
            if self._connect():
                return True
            # Not the whole timeout: a loop polling every hour would stay an
            # hour without LISTEN after one failed connect.
            stop.wait(self._until_retry(timeout))
            return False
        # In slices, so that stop() (set from another thread or a signal
        # handler) ends the wait within STOP_CHECK seconds, not the timeout.
        deadline = time.monotonic() + timeout
        try:
            while not stop.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                for notify in self.conn.notifies(timeout=min(left, STOP_CHECK), stop_after=1):
                    self._notified(notify.payload)
                    return True
        except psycopg.Error as exc:
            self.close()
            self._dropped(exc)
            stop.wait(self._until_retry(timeout))
        return False

    def close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                conn.close()


class AsyncListener(_Session):
    """Listener on a psycopg AsyncConnection, for the asyncio loops."""

    conn: psycopg.AsyncConnection[Any] | None

    async def _connect(self) -> bool:
        if not self._may_connect():
            return False
        try:
            conn = await psycopg.AsyncConnection.connect(self.dsn, autocommit=True)
            await conn.execute(listen_statement(self.channel))
        except psycopg.Error as exc:
            self._unavailable(exc)
            return False
        self._connected(conn)
        return True

    async def wait(self, timeout: float, stop: asyncio.Event) -> bool:
        """As Listener.wait."""
        if self.conn is None:
            if await self._connect():
                return True
            await wait_event(stop, self._until_retry(timeout))
            return False
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
            return False
        exc = notified.exception()
        if isinstance(exc, psycopg.Error):
            await self.close()
            self._dropped(exc)
            await wait_event(stop, self._until_retry(timeout))
            return False
        if exc is not None:
            raise exc
        return notified.result()

    async def _one_notify(self, conn: psycopg.AsyncConnection[Any], timeout: float) -> bool:
        async for notify in conn.notifies(timeout=timeout, stop_after=1):
            self._notified(notify.payload)
            return True
        return False

    async def close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                await conn.close()


# How long a MultiListener's per-server thread (task) waits in one call of
# its Listener: while a server is down, how often it looks whether the
# backoff before reconnecting has passed.
WATCH_SLICE = 1.0


class _Servers:
    """What the sync and async multi-listeners share: the DSNs to listen on,
    from a sequence or a callable asked again every `refresh` seconds."""

    def __init__(self, dsns: Sequence[str] | Callable[[], Sequence[str]], channel: str,
                 refresh: float, on_notify: Callable[[str], None] | None) -> None:  # fmt: skip
        self.channel = channel
        self.on_notify = on_notify
        self._source = dsns if callable(dsns) else None
        self._static = None if callable(dsns) else checked_dsns(dsns)
        self._refresh = refresh
        self._due = 0.0
        self._backoff = Backoff(base=1.0, cap=max(1.0, refresh))

    def _due_now(self) -> bool:
        """Whether the DSNs are to be (re)read now."""
        return time.monotonic() >= self._due

    def _read(self, dsns: Sequence[str]) -> list[str]:
        """The DSNs a read returned, checked; the next read is due in
        `refresh` seconds (never again for a static sequence)."""
        wanted = checked_dsns(dsns)
        self._backoff.reset()
        self._due = float("inf") if self._static is not None else time.monotonic() + self._refresh
        return wanted

    def _unread(self, exc: BaseException) -> None:
        """A read failed: the sessions stay as they are; read again after a
        backoff."""
        delay = self._backoff.next()
        self._due = time.monotonic() + delay
        log.warning(
            "LISTEN %s: could not read the servers to listen on (%s); retrying in %.1fs",
            self.channel,
            first_line(exc),
            delay,
            exc_info=not isinstance(exc, (psycopg.Error, ValueError, TypeError)),
        )

    def _listener(self, cls: type[Any], dsn: str) -> Any:
        listener = cls(dsn, self.channel, on_notify=self.on_notify)
        listener.label = f"{self.channel} on {server_of(dsn)}"
        return listener


class MultiListener(_Servers):
    """LISTEN sessions on one channel over several servers, one daemon thread
    each; `wait(timeout, stop)` returns True after a notification on any of
    them (or a session (re)established), False after the timeout or stop."""

    def __init__(
        self,
        dsns: Sequence[str] | Callable[[], Sequence[str]],
        channel: str,
        *,
        refresh: float = REFRESH,
        on_notify: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__(dsns, channel, refresh, on_notify)
        self._woken = threading.Event()
        self._watchers: dict[str, tuple[threading.Thread, threading.Event]] = {}

    @property
    def dsns(self) -> list[str]:
        """The servers listened on (or being reconnected to)."""
        return list(self._watchers)

    def refresh(self) -> None:
        """Start sessions for new DSNs and end those of dropped ones, when
        the DSNs are due to be read."""
        if not self._due_now():
            return
        try:
            if self._static is not None:
                wanted = self._read(self._static)
            else:
                assert self._source is not None
                wanted = self._read(self._source())
        except Exception as exc:
            self._unread(exc)
            return
        for dsn in [d for d in self._watchers if d not in wanted]:
            _, closing = self._watchers.pop(dsn)
            closing.set()  # the thread closes its session and ends
            log.info("LISTEN %s: stopped listening on %s", self.channel, server_of(dsn))
        for dsn in wanted:
            if dsn not in self._watchers:
                closing = threading.Event()
                thread = threading.Thread(
                    target=self._watch,
                    args=(self._listener(Listener, dsn), closing),
                    name=f"runrelay-listen-{self.channel}",
                    daemon=True,
                )
                self._watchers[dsn] = (thread, closing)
                thread.start()

    def _watch(self, listener: Listener, closing: threading.Event) -> None:
        try:
            while not closing.is_set():
                if listener.wait(WATCH_SLICE, closing):
                    self._woken.set()
        finally:
            listener.close()

    def wait(self, timeout: float, stop: threading.Event) -> bool:
        self.refresh()
        deadline = time.monotonic() + timeout
        while not stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if self._woken.wait(min(left, STOP_CHECK)):
                # Cleared before the caller looks for work, so a notification
                # that comes during that look wakes the next wait.
                self._woken.clear()
                return True
        return False

    def close(self) -> None:
        watchers, self._watchers = self._watchers, {}
        for _, closing in watchers.values():
            closing.set()
        for thread, _ in watchers.values():
            thread.join(timeout=5)


class AsyncMultiListener(_Servers):
    """MultiListener for the asyncio loops: one task per server; a callable
    `dsns` is called in a thread (it may connect to read them)."""

    def __init__(
        self,
        dsns: Sequence[str] | Callable[[], Sequence[str]],
        channel: str,
        *,
        refresh: float = REFRESH,
        on_notify: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__(dsns, channel, refresh, on_notify)
        self._woken = asyncio.Event()
        self._watchers: dict[str, tuple[asyncio.Task[None], asyncio.Event]] = {}
        self._ending: set[asyncio.Task[None]] = set()

    @property
    def dsns(self) -> list[str]:
        return list(self._watchers)

    async def refresh(self) -> None:
        """As MultiListener.refresh."""
        if not self._due_now():
            return
        try:
            if self._static is not None:
                wanted = self._read(self._static)
            else:
                assert self._source is not None
                wanted = self._read(await asyncio.to_thread(self._source))
        except Exception as exc:
            self._unread(exc)
            return
        for dsn in [d for d in self._watchers if d not in wanted]:
            task, closing = self._watchers.pop(dsn)
            closing.set()
            self._ending.add(task)
            task.add_done_callback(self._ending.discard)
            log.info("LISTEN %s: stopped listening on %s", self.channel, server_of(dsn))
        for dsn in wanted:
            if dsn not in self._watchers:
                closing = asyncio.Event()
                task = asyncio.create_task(self._watch(self._listener(AsyncListener, dsn), closing))
                self._watchers[dsn] = (task, closing)

    async def _watch(self, listener: AsyncListener, closing: asyncio.Event) -> None:
        try:
            while not closing.is_set():
                if await listener.wait(WATCH_SLICE, closing):
                    self._woken.set()
        finally:
            await listener.close()

    async def wait(self, timeout: float, stop: asyncio.Event) -> bool:
        await self.refresh()
        woken = asyncio.ensure_future(self._woken.wait())
        stopped = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({woken, stopped}, timeout=timeout,
                               return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
        finally:
            woken.cancel()
            stopped.cancel()
        if self._woken.is_set() and not stop.is_set():
            self._woken.clear()
            return True
        return False

    async def close(self) -> None:
        watchers, self._watchers = self._watchers, {}
        for _, closing in watchers.values():
            closing.set()
        tasks = [t for t, _ in watchers.values()] + list(self._ending)
        await asyncio.gather(*tasks, return_exceptions=True)


def checked_dsns(dsns: Any) -> list[str]:
    """A list of DSNs to listen on, or TypeError / ValueError saying why not."""
    if isinstance(dsns, str) or not isinstance(dsns, Sequence):
        raise TypeError(f"expected a sequence of DSN strings, got {type(dsns).__name__}")
    out: list[str] = []
    for dsn in dsns:
        if not isinstance(dsn, str) or not dsn:
            raise TypeError(f"a DSN to listen on must be a non-empty string, got {dsn!r}")
        if dsn not in out:
            out.append(dsn)
    if not out:
        raise ValueError("no DSN to listen on (pass None to poll without LISTEN)")
    return out


def check_listen_dsn(listen_dsn: Any) -> None:
    """Raise TypeError / ValueError for a loop's listen_dsn that is neither
    None, a DSN, a non-empty sequence of DSNs nor a callable."""
    if listen_dsn is None or isinstance(listen_dsn, str) or callable(listen_dsn):
        return
    checked_dsns(listen_dsn)


def make_listener(
    listen_dsn: ListenDsn | None, channel: str, on_notify: Callable[[str], None] | None = None
) -> Listener | MultiListener | None:
    """The LISTEN session(s) a loop's listen_dsn asks for: none (poll), one
    Listener for one DSN, a MultiListener for several or a callable."""
    if not listen_dsn:
        return None
    if isinstance(listen_dsn, str):
        return Listener(listen_dsn, channel, on_notify=on_notify)
    return MultiListener(listen_dsn, channel, on_notify=on_notify)


def make_async_listener(
    listen_dsn: ListenDsn | None, channel: str, on_notify: Callable[[str], None] | None = None
) -> AsyncListener | AsyncMultiListener | None:
    """make_listener for the asyncio loops."""
    if not listen_dsn:
        return None
    if isinstance(listen_dsn, str):
        return AsyncListener(listen_dsn, channel, on_notify=on_notify)
    return AsyncMultiListener(listen_dsn, channel, on_notify=on_notify)


def server_of(dsn: str) -> str:
    """host:port/dbname of a DSN, for log lines (never its password)."""
    try:
        params = conninfo.conninfo_to_dict(dsn)
    except psycopg.Error:
        return "(unparsable DSN)"
    host = params.get("host", "") or "localhost"
    return f"{host}:{params.get('port', '5432')}/{params.get('dbname', '')}"
