"""Maintenance: the periodic duties no single run triggers.

    maintenance = Maintenance(client, interval=30.0, prune_after=timedelta(days=7))
    maintenance.run()            # until stop() / SIGINT / SIGTERM
    maintenance.run_once()       # one round -> {"reaped": 3, "scheduled": 1,
                                 #               "recorded": 1, "pruned": 120}

Duties, each round:

* **reap** — `reap_expired` ends the leases of workers that died (their runs
  retry or fail by the normal rules) and applies stranded cancellations. It is
  called again while a call returns as many rows as it was allowed to, at
  most `max_calls` times, so a backlog drains without one long transaction.
* **schedule** — `enqueue_due_schedules` enqueues one run per due slot of
  the declared schedules (upsert_schedule; docs/operations.md, "Periodic
  runs"), `schedule_batch` slots a call, again while a call is full, at
  most `max_calls` times. Each slot is enqueued once however many loops
  run it (row locks SKIP LOCKED, a run_id per slot). After the round the
  loop asks `schedules_next_due_at` and sleeps no longer than until the
  next slot (measured by the database clock), so a schedule due every
  minute is not late by a whole interval.
* **activity** — `record_queue_activity` finalizes the whole minutes of
  queue activity (runs ended completed / failed, per queue) that are at
  least two minutes old into the rollup queue_overview reads
  (docs/admin.md, "The overview"); one call a round, which answers how many
  minutes it finalized. Concurrent loops never count a minute twice: the
  first takes the rollup without waiting, the others answer 0.
* **prune** — with `prune_after` set, `prune(delivered_before=now -
  prune_after)` deletes delivered ledger events in chunks of `prune_batch`,
  again at most `max_calls` chunks per round.
* **purge** — with `purge_after` set (off by default), `purge_runs(
  finished_before=now - purge_after)` deletes runs that ended (completed,
  failed or cancelled) longer ago than that, with every row of theirs
  (attempts, signals, ledger events, calls), `purge_batch` runs a call, at
  most `max_calls` calls per round. Runs with undelivered events are kept
  until a relay delivers them (or an operator purges them by hand).

Which role may call what (plpgsql/grants.sql): `reap_expired` is a worker
function, `prune` an admin one, `enqueue_due_schedules`,
`schedules_next_due_at` and `record_queue_activity` both. A duty whose call
raises PermissionDenied is switched off for the life of this object with one
WARNING line; the other duties go on. A superuser or the schema owner may
run them all.

Every Worker and AsyncWorker runs reap, schedule and activity on its own
(see worker.py), so a fleet of workers recovers a SIGKILLed peer's runs,
enqueues its schedules and keeps the overview's rollup current without any
extra process; `runrelay maintain` is for pruning, or for fleets that opt
out.

The loop survives the database being away: a failed round is logged and the
next one waits a full-jitter backoff instead of the interval. The interval
itself is jittered ±50% so that many processes do not reap in step.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

from ._backoff import CONNECTION_ERRORS, Backoff, first_line, jittered, wait_event
from ._steps import Call, Pause, Steps, drive, drive_async
from .errors import PermissionDenied
from .types import ScheduleDue

log = logging.getLogger("runrelay.maintenance")

DUTIES = ("reap", "schedule", "activity", "prune", "purge")

# A loop woken for a schedule slot sleeps until this long after it (the
# slot's time by the database clock), and never less than MIN_WAKE between
# rounds: a slot a peer holds (SKIP LOCKED) is not polled in a busy loop.
SLOT_GRACE = 0.05
MIN_WAKE = 0.1


# What a duty's call answers, as a count of what it did.
def _count(answer: Any) -> int:
    return answer if isinstance(answer, int) else len(answer)


class _Duties:
    """The maintenance loop, written once: settings, which duties a
    PermissionDenied has switched off, and the rounds as bodies of steps
    (runrelay._steps) that Maintenance performs by blocking and
    AsyncMaintenance by awaiting."""

    _stop: Any  # threading.Event or asyncio.Event: only set() and is_set() here

    def __init__(
        self,
        client: Any,
        *,
        interval: float = 30.0,
        prune_after: timedelta | None = timedelta(days=7),
        reap_batch: int = 100,
        prune_batch: int = 10000,
        max_calls: int = 50,
        reap: bool = True,
        schedules: bool = True,
        schedule_batch: int = 100,
        activity: bool = True,
        purge_after: timedelta | None = None,
        purge_batch: int = 1000,
    ) -> None:
        if interval <= 0:
            raise ValueError(f"interval must be positive, got {interval!r}")
        if prune_after is not None and prune_after < timedelta(0):
            raise ValueError(f"prune_after must not be negative, got {prune_after!r}")
        if purge_after is not None and purge_after <= timedelta(0):
            raise ValueError(f"purge_after must be positive, got {purge_after!r}")
        if purge_batch < 1:
            raise ValueError("purge_batch must be at least 1")
        if reap_batch < 1 or prune_batch < 1 or schedule_batch < 1 or max_calls < 1:
            raise ValueError(
                "reap_batch, prune_batch, schedule_batch and max_calls must be at least 1"
            )
        self.client = client
        self.interval = interval
        self.prune_after = prune_after
        self.purge_after = purge_after
        self.purge_batch = purge_batch
        self.reap_batch = reap_batch
        self.prune_batch = prune_batch
        self.schedule_batch = schedule_batch
        self.max_calls = max_calls
        self.disabled: set[str] = set()
        if not reap:
            self.disabled.add("reap")
        if prune_after is None:
            self.disabled.add("prune")
        if purge_after is None:
            self.disabled.add("purge")
        if not schedules:
            self.disabled.add("schedule")
        if not activity:
            self.disabled.add("activity")
        self._signals = 0
        self._stop = self._new_event()

    def _new_event(self) -> Any:
        raise NotImplementedError

    def stop(self) -> None:
        """End run() after the current call."""
        self._stop.set()

    def _denied(self, duty: str, exc: PermissionDenied) -> None:
        self.disabled.add(duty)
        log.warning(
            "maintenance duty %s disabled: this role may not call it (%s)",
            duty,
            exc.message,
            extra={"duty": duty},
        )

    def _until_slot(self, delay: float, due: ScheduleDue | None) -> float:
        """The sleep after a round: `delay`, or less when a schedule slot
        comes sooner."""
        if due is None or due.due_in_ms is None:
            return delay
        return min(delay, max(MIN_WAKE, due.due_in_ms / 1000 + SLOT_GRACE))

    def _signal_count(self) -> int:
        self._signals += 1
        return self._signals

    # -- the bodies --------------------------------------------------------
    def _round_steps(self) -> Steps[dict[str, int]]:
        """One round of every enabled duty -> {"reaped": n, "scheduled": s,
        "recorded": minutes, "pruned": m, "purged": runs}. Connection errors
        propagate; the loop handles them."""
        done = {"reaped": 0, "scheduled": 0, "recorded": 0, "pruned": 0, "purged": 0}
        if "reap" not in self.disabled:
            done["reaped"] = yield from self._chunks_steps(
                "reap", "reap_expired", {"max_attempts": self.reap_batch}, self.reap_batch
            )
        if "schedule" not in self.disabled:
            done["scheduled"] = yield from self._chunks_steps(
                "schedule",
                "enqueue_due_schedules",
                {"max_runs": self.schedule_batch},
                self.schedule_batch,
            )
        if "activity" not in self.disabled:
            done["recorded"] = yield from self._chunks_steps(
                "activity", "record_queue_activity", {}, None
            )
        if "prune" not in self.disabled:
            assert self.prune_after is not None
            cutoff = datetime.now(UTC) - self.prune_after
            done["pruned"] = yield from self._chunks_steps(
                "prune",
                "prune",
                {"delivered_before": cutoff, "max_rows": self.prune_batch},
                self.prune_batch,
            )
        if "purge" not in self.disabled:
            assert self.purge_after is not None
            done["purged"] = yield from self._chunks_steps(
                "purge",
                "purge_runs",
                {
                    "finished_before": datetime.now(UTC) - self.purge_after,
                    "max_rows": self.purge_batch,
                },
                self.purge_batch,
            )
        level = logging.INFO if any(done.values()) else logging.DEBUG
        log.log(level, "maintenance round", extra=dict(done))
        return done

    def _chunks_steps(
        self, duty: str, method: str, kwargs: dict[str, Any], full: int | None
    ) -> Steps[int]:
        """Call a duty again while a call did as much as it was allowed to
        (`full`; None: a duty that does all its work in one call), at most
        max_calls times -> how much it did in all."""
        total = 0
        try:
            for _ in range(self.max_calls):
                n = _count((yield Call(method, kwargs)))
                total += n
                if full is None or n < full or self._stop.is_set():
                    break
        except PermissionDenied as exc:
            self._denied(duty, exc)
        return total

    def _next_slot_steps(self) -> Steps[ScheduleDue | None]:
        """schedules_next_due_at, or None when the schedule duty is off."""
        if "schedule" in self.disabled:
            return None
        try:
            due: ScheduleDue = yield Call("schedules_next_due_at", {})
        except PermissionDenied as exc:
            self._denied("schedule", exc)
            return None
        return due

    def _run_steps(self) -> Steps[None]:
        """Rounds until stop(); each followed by a jittered interval, or by a
        backoff after the database failed the round."""
        backoff = Backoff(base=0.5, cap=max(1.0, self.interval))
        log.info("maintenance started", extra={"interval_s": self.interval})
        while not self._stop.is_set():
            try:
                yield from self._round_steps()
                backoff.reset()
                due = yield from self._next_slot_steps()
                delay = self._until_slot(jittered(self.interval), due)
            except CONNECTION_ERRORS as exc:
                delay = backoff.next()
                log.warning(
                    "maintenance round failed (%s); retrying in %.1fs", first_line(exc), delay
                )
            if self.disabled.issuperset(DUTIES):
                log.warning("maintenance has no duty left that this role may run; stopping")
                return
            yield Pause(delay)


class Maintenance(_Duties):
    """Reaps expired leases, enqueues due schedule slots, rolls up queue
    activity and prunes delivered events on a jittered interval.

    `reap=False` leaves reaping to others (a prune-only loop); `schedules=False`
    enqueues no schedule; `activity=False` records no queue activity;
    `prune_after=None` never prunes."""

    _stop: threading.Event

    def _new_event(self) -> threading.Event:
        return threading.Event()

    def install_signal_handlers(self) -> None:
        """First SIGINT/SIGTERM: finish the round and return from run(). A
        second one: stop at once (KeyboardInterrupt) — nothing is held."""

        def handle(signum: int, _frame: Any) -> None:
            if self._signal_count() == 1:
                log.info("%s: stopping after this round", signal.Signals(signum).name)
                self.stop()
                return
            log.warning("%s again: stopping now", signal.Signals(signum).name)
            raise KeyboardInterrupt

        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, handle)

    def _perform(self, step: Any) -> Any:
        if isinstance(step, Call):
            return getattr(self.client, step.method)(**step.kwargs)
        assert isinstance(step, Pause)
        self._stop.wait(step.seconds)
        return None

    def run_once(self) -> dict[str, int]:
        """One round of every enabled duty -> {"reaped": n, "scheduled": s,
        "recorded": minutes, "pruned": m, "purged": runs}. Connection errors
        propagate; the loop in run() handles them."""
        return drive(self._round_steps(), self._perform)

    def next_slot(self) -> ScheduleDue | None:
        """schedules_next_due_at, or None when the schedule duty is off."""
        return drive(self._next_slot_steps(), self._perform)

    def run(self) -> None:
        """Rounds until stop(); each followed by a jittered interval, or by a
        backoff after the database failed the round."""
        drive(self._run_steps(), self._perform)


class AsyncMaintenance(_Duties):
    """Maintenance on an AsyncClient, for asyncio programs and AsyncWorker."""

    _stop: asyncio.Event

    def _new_event(self) -> asyncio.Event:
        return asyncio.Event()

    def install_signal_handlers(self) -> None:
        """As Maintenance.install_signal_handlers, on the running event loop."""
        loop = asyncio.get_running_loop()

        def handle(sig: signal.Signals) -> None:
            if self._signal_count() == 1:
                log.info("%s: stopping after this round", sig.name)
                self.stop()
                return
            log.warning("%s again: stopping now", sig.name)
            for task in asyncio.all_tasks(loop):
                task.cancel()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, handle, sig)

    async def _perform(self, step: Any) -> Any:
        if isinstance(step, Call):
            return await getattr(self.client, step.method)(**step.kwargs)
        assert isinstance(step, Pause)
        await wait_event(self._stop, step.seconds)
        return None

    async def run_once(self) -> dict[str, int]:
        """As Maintenance.run_once."""
        return await drive_async(self._round_steps(), self._perform)

    async def next_slot(self) -> ScheduleDue | None:
        """As Maintenance.next_slot."""
        return await drive_async(self._next_slot_steps(), self._perform)

    async def run(self) -> None:
        """As Maintenance.run."""
        await drive_async(self._run_steps(), self._perform)
