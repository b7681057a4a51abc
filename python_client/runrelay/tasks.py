"""Named tasks: plain functions a worker runs by name.

    tasks = runrelay.Tasks()

    @tasks.task("send_email", queue="email", max_attempts=5, timeout=30)
    def send_email(job, *, to, subject):
        ...

    send_email.enqueue(client, run_id="welcome-42", to="a@example.com", subject="hi")
    runrelay.Worker(client, tasks).run()      # or: runrelay worker myapp.jobs:tasks

A run enqueued through a task carries the task's name (`runs.task`); a
worker given a registry claims only runs of its tasks, on its tasks'
queues, so a worker never takes a run it has no handler for, and an
application's workers leave another application's runs alone. The handler
is called as `fn(job, **payload)`: the payload is the keyword arguments
given to enqueue, checked against the function's signature when they are
enqueued, so a typo fails in the caller, not in a retry loop later.

Enqueue options are keyword arguments too, so they cannot also be task
parameters: `run_id` (default: a new uuid; give your own to make the
enqueue idempotent), `run_at`, `priority` (higher runs first),
`concurrency_key`, `max_attempts` (default: the task's) and
`payload_retention`. Given a Client or AsyncClient, enqueue is that
client's call; given a psycopg connection, it runs on that connection, so
it commits or rolls back with the caller's transaction.
"""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import psycopg

from .client import AsyncClient, Client

if TYPE_CHECKING:
    from .worker import Job

# The keyword arguments of Task.enqueue that are not payload.
ENQUEUE_OPTIONS = (
    "run_id",
    "run_at",
    "priority",
    "concurrency_key",
    "max_attempts",
    "payload_retention",
)


class UnknownTask(Exception):
    """A claimed run names a task this registry does not have."""


@dataclass(frozen=True)
class Task:
    """One named task: its function and how its runs are enqueued and run.
    Calling the Task calls the function (tests, or running it inline)."""

    name: str
    fn: Callable[..., Any]
    queue: str = "default"
    max_attempts: int = 3
    timeout: float | None = None
    schema: str = "runrelay"

    def __call__(self, job: Job, /, *args: Any, **kwargs: Any) -> Any:
        return self.fn(job, *args, **kwargs)

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)

    def check(self, payload: dict[str, Any]) -> None:
        """Refuse a payload the function cannot be called with (TypeError,
        naming the task)."""
        try:
            inspect.signature(self.fn).bind(None, **payload)
        except TypeError as exc:
            raise TypeError(f"task {self.name!r}: {exc}") from None

    def enqueue(
        self,
        target: Client | AsyncClient | psycopg.Connection[Any] | psycopg.AsyncConnection[Any],
        /,
        *,
        run_id: str | None = None,
        run_at: datetime | None = None,
        priority: int = 0,
        concurrency_key: str | None = None,
        max_attempts: int | None = None,
        payload_retention: str = "keep",
        **payload: Any,
    ) -> Any:
        """Enqueue a run of this task -> EnqueueResult (awaitable for an
        AsyncClient or an AsyncConnection). The keyword arguments beyond the
        options are the payload, checked against the function's signature."""
        self.check(payload)
        kwargs: dict[str, Any] = {
            "run_id": run_id if run_id is not None else str(uuid.uuid4()),
            "queue": self.queue,
            "payload": payload,
            "run_at": run_at,
            "priority": priority,
            "max_attempts": self.max_attempts if max_attempts is None else max_attempts,
            "payload_retention": payload_retention,
            "concurrency_key": concurrency_key,
            "task": self.name,
        }
        if isinstance(target, Client | AsyncClient):
            return target.enqueue_run(**kwargs)
        if isinstance(target, psycopg.AsyncConnection):
            return AsyncClient(target, schema=self.schema).enqueue_run(**kwargs, conn=target)
        if isinstance(target, psycopg.Connection):
            return Client(target, schema=self.schema).enqueue_run(**kwargs, conn=target)
        raise TypeError(
            f"enqueue needs a runrelay Client or AsyncClient or a psycopg connection, "
            f"got {type(target).__name__}"
        )


class Tasks:
    """A registry of named tasks: what a worker runs, and how to enqueue it.

    `schema` is the install whose runs a bare psycopg connection enqueues
    (a Client brings its own)."""

    def __init__(self, *, schema: str = "runrelay") -> None:
        self.schema = schema
        self._tasks: dict[str, Task] = {}

    def task(
        self,
        name: str,
        *,
        queue: str = "default",
        max_attempts: int = 3,
        timeout: float | None = None,
    ) -> Callable[[Callable[..., Any]], Task]:
        """Register a function of `(job, **payload)` as task `name`: its runs
        go to `queue`, are attempted at most `max_attempts` times, and each
        attempt gets at most `timeout` seconds (None: no limit; see
        runrelay.worker for what a timeout does to sync and async handlers)."""
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"a task name is a non-blank string, got {name!r}")
        if not isinstance(queue, str) or not queue.strip():
            raise ValueError(f"task {name!r}: queue is a non-blank string, got {queue!r}")
        if timeout is not None and not timeout > 0:
            raise ValueError(f"task {name!r}: timeout must be a positive number of seconds")
        if name in self._tasks:
            raise ValueError(f"task {name!r} is registered twice")

        def register(fn: Callable[..., Any]) -> Task:
            _check_signature(name, fn)
            task = Task(name, fn, queue, max_attempts, timeout, self.schema)
            self._tasks[name] = task
            return task

        return register

    def __iter__(self) -> Iterator[Task]:
        return iter(self._tasks.values())

    def __len__(self) -> int:
        return len(self._tasks)

    def __contains__(self, name: object) -> bool:
        return name in self._tasks

    def __getitem__(self, name: str) -> Task:
        return self._tasks[name]

    @property
    def names(self) -> list[str]:
        """The task names, in registration order: a worker's claim filter."""
        return list(self._tasks)

    @property
    def queues(self) -> list[str]:
        """The queues of the tasks, each once, in registration order."""
        return list(dict.fromkeys(t.queue for t in self._tasks.values()))

    def of(self, job: Job) -> Task:
        """The task that runs `job`'s run."""
        task = self._tasks.get(job.attempt.task or "")
        if task is None:
            raise UnknownTask(
                f"run {job.run_id!r} names task {job.attempt.task!r}, which this worker "
                f"does not have (it has {', '.join(self._tasks) or 'none'})"
            )
        return task

    def __call__(self, job: Job) -> Any:
        """Run `job` with its task's function: fn(job, **payload). Returns
        what the function returns (a coroutine for an async function)."""
        task = self.of(job)
        payload = job.payload
        if payload is None:
            payload = {}
        if not isinstance(payload, dict):
            raise TypeError(
                f"task {task.name!r} takes keyword arguments; run {job.run_id!r} has a "
                f"{type(payload).__name__} payload"
            )
        return task.fn(job, **payload)


def _check_signature(name: str, fn: Callable[..., Any]) -> None:
    """A task function takes the job first, then keyword arguments none of
    which is an enqueue option."""
    if not callable(fn):
        raise TypeError(f"task {name!r}: {fn!r} is not callable")
    params = list(inspect.signature(fn).parameters.values())
    if not params or params[0].kind not in (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    ):
        raise TypeError(f"task {name!r}: the function must take the job as its first argument")
    for param in params[1:]:
        if param.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.VAR_POSITIONAL):
            raise TypeError(
                f"task {name!r}: parameter {param.name!r} cannot be given by keyword; "
                "a task's arguments are its payload's keys"
            )
        if param.name in ENQUEUE_OPTIONS:
            raise TypeError(
                f"task {name!r}: parameter {param.name!r} is an enqueue option "
                f"({', '.join(ENQUEUE_OPTIONS)}); rename it"
            )
