"""Live pages: PostgreSQL notifications turned into server-sent events.

The engine notifies on every change a page shows, on its install's channels
(`<schema>_runs`: a queue has runnable work: enqueues, retries, wakes, a
resumed queue; `<schema>_terminal`: a run ended; `<schema>_ledger`: a lane
has events to deliver; `<schema>_delivered`: events were acknowledged). One
connection of the dashboard LISTENs on its schema's four and fans each
notification out to every open page's event stream (`GET /live`); another
install in the same database does not refresh its pages.

Pages do not re-render on every notification: each stream sends at most one
`change` event a second (notifications in between are folded into the
next), and a `tick` every TICK_SECONDS when nothing happened, so ages and
sparklines move with the clock and idle proxies keep the stream open. The
page's script then fetches itself and swaps the parts marked `data-live`.

The listener reconnects on its own (full-jitter backoff) when the database
goes away; while it is away the streams still tick, so pages keep polling
at the tick's pace.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator

import psycopg

from .._listen import listen_statement
from ..contract import channel

# The channels that say a page changed (not <schema>_cancel: a cancel that
# ends a run also notifies <schema>_terminal).
PAGE_KINDS = ("runs", "ledger", "terminal", "delivered")

log = logging.getLogger("runrelay.dashboard")

# The fewest seconds between two refreshes of one page.
MIN_GAP_SECONDS = 1.0
# A refresh at least this often, for the clock's sake.
TICK_SECONDS = 15.0


class Notifications:
    """One LISTEN connection shared by every open page."""

    def __init__(self, database_url: str, schema: str = "runrelay") -> None:
        self._url = database_url
        self.channels = tuple(channel(schema, kind) for kind in PAGE_KINDS)
        self._subscribers: set[asyncio.Queue[str]] = set()
        self.listening = False

    def subscribe(self) -> asyncio.Queue[str]:
        # One slot: a page that has not caught up yet needs one refresh, not many.
        queue: asyncio.Queue[str] = asyncio.Queue(maxsize=1)
        self._subscribers.add(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue[str]) -> None:
        self._subscribers.discard(queue)

    def publish(self, channel: str) -> None:
        for queue in self._subscribers:
            if queue.empty():
                queue.put_nowait(channel)

    async def run(self) -> None:
        """LISTEN until cancelled, reconnecting whenever the connection fails."""
        failures = 0
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                    self._url, autocommit=True
                ) as conn:
                    for name in self.channels:
                        await conn.execute(listen_statement(name))
                    self.listening = True
                    failures = 0
                    log.info("listening for changes on %s", ", ".join(self.channels))
                    # Anything may have changed while we were away.
                    self.publish("reconnected")
                    async for notify in conn.notifies():
                        self.publish(notify.channel)
            except psycopg.Error as exc:
                self.listening = False
                failures += 1
                delay = random.uniform(0, min(30.0, 0.5 * 2**failures))
                log.warning("change notifications lost (%s); again in %.1fs", exc, delay)
                await asyncio.sleep(delay)


async def event_stream(notifications: Notifications) -> AsyncIterator[str]:
    """The text/event-stream of one page: `change` events, at most one a
    MIN_GAP_SECONDS, and a `tick` every TICK_SECONDS otherwise."""
    queue = notifications.subscribe()
    try:
        yield "retry: 3000\n\n"
        while True:
            try:
                channel = await asyncio.wait_for(queue.get(), timeout=TICK_SECONDS)
            except TimeoutError:
                yield "event: tick\ndata: \n\n"
                continue
            yield f"event: change\ndata: {channel}\n\n"
            await asyncio.sleep(MIN_GAP_SECONDS)
    finally:
        notifications.unsubscribe(queue)
