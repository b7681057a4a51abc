"""Durable steps: a handler written as straight-line code whose finished
steps survive crashes, retries and waits.

    @tasks.task("order")
    def order(job, *, order_id: str):
        charge = job.step("charge", payments.charge, order_id)
        approval = job.wait_for_event("approval", event=f"approve:{order_id}", timeout=86400)
        if approval and approval["approved"]:
            job.step("ship", shipping.ship, order_id, charge["id"])

`job.step(name, fn, *args)` returns the step's recorded result when the run
has one under `name` (every claim brings the run's steps); otherwise it runs
`fn(*args)`, records the JSON result with record_step (one round trip) and
returns it. `job.sleep(name, seconds)` and `job.wait_for_event(name, event=,
timeout=)` are steps too: the first time they suspend the run (the typed
waits); after the wake they record what the wake delivered under `name` and
return it. On an AsyncWorker each of them is awaited, and `fn` may be a
coroutine function.

What is exactly once, and what is not (docs/durable-steps.md): the record of
a step is written once per run; the work inside a step is at least once (a
crash between the work and its record repeats it), so work with side effects
takes `job.step_key(name)`, stable across attempts, as its idempotency key.
Code between steps must be deterministic: a retried attempt replays it and
must reach the same steps in the same order.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
import time
from collections.abc import Callable
from typing import Any

from ._backoff import CONNECTION_ERRORS
from .types import StepOutcome

STEP_NAME_MAX = 200
# A step key longer than this is hashed: payment providers cap idempotency
# keys at 255 characters.
STEP_KEY_MAX = 255
# record_step after a lost connection: the same call again (an exact replay
# when the lost one committed), this many times, these seconds apart.
RECORD_RETRIES = (0.2, 0.5, 1.0, 2.0, 5.0)


class StepError(Exception):
    """A step used wrongly: a name reused within one attempt, a result that
    is not JSON, or a wake that is not this step's (code between steps that
    is not deterministic). The handler's attempt fails with it."""


class StepLost(Exception):
    """A step's record was refused because the attempt no longer holds the
    run (fence_lost) or the run was cancelled: the handler must stop. Its
    work ran; the attempt that holds the run now, if any, does it again."""

    def __init__(self, step: str, outcome: str) -> None:
        super().__init__(f"step {step!r} not recorded: {outcome}")
        self.step = step
        self.outcome = outcome


def step_name(name: object) -> str:
    """A valid step name, or StepError."""
    if not isinstance(name, str) or not name.strip() or len(name) > STEP_NAME_MAX:
        raise StepError(
            f"a step name is a non-blank string of at most {STEP_NAME_MAX} characters, not {name!r}"
        )
    return name


def as_json(name: str, value: Any) -> Any:
    """`value` as it reads back from JSON (tuples become lists, ...), so a
    step returns the same value the first time and on replay; StepError
    when it is not JSON."""
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise StepError(
            f"step {name!r} returned a value that is not JSON ({exc}); "
            "return dicts, lists, strings, numbers, booleans or None"
        ) from None


def step_key(run_id: str, name: str) -> str:
    """The idempotency key of a run's step: the same on every attempt."""
    key = f"{run_id}:{name}"
    if len(key) <= STEP_KEY_MAX:
        return key
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


class DurableSteps:
    """The durable-step methods of a Job. The Job provides the attempt, the
    client (set by its worker), whether the client is async, and how to
    suspend (_suspend_sleep, _suspend_event)."""

    # Provided by Job.
    attempt: Any
    client: Any
    is_async: bool
    _steps: dict[str, Any] | None
    _names: set[str]
    _resume_taken: bool

    def _suspend_sleep(self, seconds: float) -> Exception:
        raise NotImplementedError

    def _suspend_event(self, event: str, timeout: float | None) -> Exception:
        raise NotImplementedError

    # -- what a handler calls ------------------------------------------------
    @property
    def steps(self) -> dict[str, Any]:
        """The run's recorded steps, step name -> result (those the claim
        brought and those this attempt recorded)."""
        if self._steps is None:
            self._steps = dict(self.attempt.steps or {})
        return self._steps

    def step_key(self, name: str) -> str:
        """The idempotency key for the side effect of step `name`: the same
        on every attempt of the run (``<run_id>:<name>``, hashed past 255
        characters). Pass it to the payment provider, the mailer, ..."""
        return step_key(self.attempt.run_id, step_name(name))

    def step(self, name: str, fn: Callable[..., Any], /, *args: Any) -> Any:
        """The result of step `name`: the recorded one, or `fn(*args)`'s,
        recorded now. On an AsyncWorker, await it (`fn` may be async)."""
        self._use(name)
        if self.is_async:
            return self._step_async(name, fn, args)
        if name in self.steps:
            return self.steps[name]
        return self._record(name, fn(*args))

    def sleep(self, name: str, seconds: float) -> Any:
        """Sleep `seconds` (by the database clock) as step `name`: the run
        waits without holding a worker, and the attempt after the wake goes
        on past this line. Returns None. On an AsyncWorker, await it."""
        self._use(name)
        if self.is_async:
            return self._wait_async(name, lambda: self._suspend_sleep(seconds), _slept)
        return self._wait(name, lambda: self._suspend_sleep(seconds), _slept)

    def wait_for_event(
        self,
        name: str,
        /,
        event: str | None = None,
        *,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> Any:
        """Wait for the signal `event` (signal_run(run_id, event, payload))
        as step `name`, at most `timeout` seconds: returns the signal's
        payload, or None when the wait timed out. (`name=` is accepted for
        the signal's name too, as `event=`.) On an AsyncWorker, await it."""
        self._use(name)
        signal = _signal_name(event, kwargs)

        def suspend() -> Exception:
            return self._suspend_event(signal, timeout)

        def delivered(resume: Any) -> Any:
            return _signal_payload(name, signal, resume)

        if self.is_async:
            return self._wait_async(name, suspend, delivered)
        return self._wait(name, suspend, delivered)

    # -- inside ----------------------------------------------------------------
    def _use(self, name: str) -> None:
        step_name(name)
        if name in self._names:
            raise StepError(
                f"step {name!r} is used twice in one attempt: a name names one step of a run "
                "(in a loop, add the index: f'poll-{i}')"
            )
        self._names.add(name)

    async def _step_async(self, name: str, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        if name in self.steps:
            return self.steps[name]
        result = fn(*args)
        if inspect.isawaitable(result):
            result = await result
        return await self._record_async(name, result)

    def _wait_start(
        self, name: str, suspend: Callable[[], Exception], delivered: Callable[[Any], Any]
    ) -> tuple[bool, Any]:
        """(True, what it returns) for a recorded wait; (False, the wake's
        resume) for the wait the run was woken from, to record; otherwise
        raises the suspension."""
        if name in self.steps:
            return True, delivered(self.steps[name])
        resume = self._take_resume()
        if resume is None:
            raise suspend()
        delivered(resume)  # checks that the wake is this step's
        return False, resume

    def _wait(
        self, name: str, suspend: Callable[[], Exception], delivered: Callable[[Any], Any]
    ) -> Any:
        done, value = self._wait_start(name, suspend, delivered)
        return value if done else delivered(self._record(name, value))

    async def _wait_async(
        self, name: str, suspend: Callable[[], Exception], delivered: Callable[[Any], Any]
    ) -> Any:
        done, value = self._wait_start(name, suspend, delivered)
        return value if done else delivered(await self._record_async(name, value))

    def _take_resume(self) -> Any:
        """What the wake delivered, for the first wait of this attempt that
        is not recorded: the wait the run suspended on (the code before it
        replayed to the same line). None when the run was not woken, or its
        wake was taken already (record_step clears it on the server too)."""
        if self._resume_taken or self.attempt.resume is None:
            return None
        self._resume_taken = True
        return self.attempt.resume

    def _fence(self) -> dict[str, Any]:
        a = self.attempt
        return {"run_id": a.run_id, "attempt": a.attempt, "lease_token": a.lease_token}

    def _record(self, name: str, value: Any) -> Any:
        result = as_json(name, value)
        if self.client is None:
            raise StepError("job.step needs the job's worker: call it from a handler")
        for delay in (*RECORD_RETRIES, None):
            try:
                outcome = self.client.record_step(**self._fence(), step=name, result=result)
                break
            except CONNECTION_ERRORS:
                if delay is None:
                    raise
                time.sleep(delay)
        return self._recorded(name, result, outcome)

    async def _record_async(self, name: str, value: Any) -> Any:
        result = as_json(name, value)
        if self.client is None:
            raise StepError("job.step needs the job's worker: call it from a handler")
        for delay in (*RECORD_RETRIES, None):
            try:
                outcome = await self.client.record_step(**self._fence(), step=name, result=result)
                break
            except CONNECTION_ERRORS:
                if delay is None:
                    raise
                await asyncio.sleep(delay)
        return self._recorded(name, result, outcome)

    def _recorded(self, name: str, result: Any, outcome: StepOutcome) -> Any:
        if outcome == StepOutcome.RECORDED:
            self.steps[name] = result
            # As on the server: the first step recorded takes the wake.
            self._resume_taken = True
            return result
        if outcome == StepOutcome.ALREADY_RECORDED:
            raise StepError(
                f"step {name!r} was already recorded for this run with another result "
                "(a name used for two steps?)"
            )
        self._lost(outcome)
        raise StepLost(name, str(outcome))

    def _lost(self, outcome: StepOutcome) -> None:
        """The attempt no longer holds the run: tell the handler (Job sets
        its cancelled flag)."""


def _slept(resume: Any) -> None:
    if not (isinstance(resume, dict) and resume.get("slept") is True):
        raise StepError(
            f"this sleep step found the wake of another wait ({resume!r}): "
            "code between steps must be deterministic"
        )


def _signal_name(event: str | None, kwargs: dict[str, Any]) -> str:
    alias = kwargs.pop("name", None)
    if kwargs:
        raise TypeError(f"wait_for_event() got unexpected arguments: {', '.join(kwargs)}")
    if event is not None and alias is not None and event != alias:
        raise TypeError("wait_for_event(): pass the signal's name once, as event=")
    signal = event if event is not None else alias
    if not isinstance(signal, str) or not signal:
        raise TypeError("wait_for_event(): event= names the signal to wait for")
    return signal


def _signal_payload(step: str, signal: str, resume: Any) -> Any:
    if isinstance(resume, dict) and resume.get("timed_out") is True:
        return None
    if isinstance(resume, dict) and resume.get("name") == signal:
        return resume.get("payload")
    raise StepError(
        f"step {step!r} waits for signal {signal!r} but found the wake of another wait "
        f"({resume!r}): code between steps must be deterministic"
    )
