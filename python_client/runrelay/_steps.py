"""One body for each loop, two shells: the sync and async loops share their logic.

A loop's state and decisions (what to call, what to do with the answer,
when to back off, what to hand back) are written once, as a generator of
*steps*: each `yield` names the I/O the logic needs next and receives its
result (or has the step's exception raised at the `yield`, so ordinary
try/except handles a connection error). A shell performs the steps: the
threaded one by blocking, the asyncio one by awaiting. This is how the
client shares its methods between Client and AsyncClient (a method builds a
call, the client runs it); here the same idea runs whole loops.

    def _claim_steps(self, n):
        try:
            claimed = yield Call("claim_attempts", {...})
        except CONNECTION_ERRORS:
            yield Pause(delay)
        ...

    drive(self._claim_steps(4), self._perform)              # Worker
    await drive_async(self._claim_steps(4), self._perform)  # AsyncWorker

Which steps exist is the loops' business (runrelay.worker defines the
worker's); this module holds the ones every loop uses and the two drivers.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")

# A loop body: yields steps, receives their results, returns T.
Steps = Generator[Any, Any, T]


@dataclass(frozen=True, slots=True)
class Call:
    """Call the client's method `method` with `kwargs`; the result is its
    answer."""

    method: str
    kwargs: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Pause:
    """Wait `seconds`; an interruptible pause ends early once the loop is
    told to stop."""

    seconds: float
    interruptible: bool = True


def drive(steps: Steps[T], perform: Callable[[Any], Any]) -> T:
    """Run a loop body to its end, performing each step with `perform`
    (blocking). A step's exception is raised inside the body at its yield."""
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            step = steps.send(value) if error is None else steps.throw(error)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        try:
            value, error = perform(step), None
        except BaseException as exc:  # the body decides
            value, error = None, exc


async def drive_async(steps: Steps[T], perform: Callable[[Any], Awaitable[Any]]) -> T:
    """As drive, awaiting each step (a cancellation is raised inside the
    body, so its finally clauses run)."""
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            step = steps.send(value) if error is None else steps.throw(error)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        try:
            value, error = await perform(step), None
        except BaseException as exc:  # the body decides
            value, error = None, exc
