"""The dashboard's pages: each a body that reads what its template shows
(one admin call or a few) from the application state's client, and `page`,
which wraps a body with the login check, rendering and the database's
failures as error pages."""

from __future__ import annotations

import contextlib
import dataclasses
import urllib.parse
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

import psycopg
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from .. import errors
from ..contract import LANES
from ..types import presumed_dead_holder
from . import present
from .state import _UNAVAILABLE, RUN_PAGE_ROWS, STATUSES, Dashboard, Redirect, _role_hint, log

Body = Callable[[Dashboard, Request], Awaitable[dict[str, Any]]]


def page(d: Dashboard, template: str, body: Body) -> Callable[[Request], Awaitable[Response]]:
    """A page handler: login check, the body's reads, rendering, and the
    database's failures as error pages."""

    async def handle(request: Request) -> Response:
        session = d.session_of(request)
        if not d.can_view(session):
            return d.to_login(request)
        try:
            context = await body(d, request)
        except Redirect as redirect:
            return RedirectResponse(redirect.target, status_code=303)
        except errors.InvalidArgument as exc:
            problem = ("Bad request", str(exc), 400)
        except errors.PermissionDenied as exc:
            problem = ("Not allowed", _role_hint(exc, f"{d.settings.schema}_admin"), 403)
        except errors.SchemaMissing as exc:
            problem = ("No runrelay schema", str(exc), 503)
        except _UNAVAILABLE as exc:
            log.warning("database unreachable or busy: %s", exc)
            problem = ("Database unreachable or busy", present.error_summary(str(exc)), 503)
        else:
            return d.render(request, template, session, **context)
        title, message, status = problem
        return d.render(request, "error.html", session, status, title=title, message=message)

    return handle


async def overview(d: Dashboard, _request: Request) -> dict[str, Any]:
    queues = [
        {
            **dataclasses.asdict(q),
            "ended_per_minute": [
                a + b for a, b in zip(q.completed_per_minute, q.failed_per_minute, strict=True)
            ],
        }
        for q in await d.client.queue_overview()
    ]
    lanes = await d.client.ledger_overview()
    return {"queues": queues, "lanes": lanes}


async def runs(d: Dashboard, request: Request) -> dict[str, Any]:
    q = request.query_params
    wanted = (q.get("id") or "").strip()
    if wanted and await d.client.get_run(wanted) is not None:
        raise Redirect("/run?" + urllib.parse.urlencode({"id": wanted}))
    queue = (q.get("queue") or "").strip() or None
    status = q.get("status") or None
    if status is not None and status not in STATUSES:
        raise errors.InvalidArgument(f"status must be one of {', '.join(STATUSES)}")
    key = (q.get("key") or "").strip() or None
    after_at = _timestamp(q.get("after_at"))
    after_id = q.get("after_id") if after_at is not None else None
    rows = await d.client.list_runs(
        queue=queue,
        status=status,
        concurrency_key=key,
        after_created_at=after_at,
        after_run_id=after_id,
        max_rows=d.settings.page_size + 1,
    )
    more = len(rows) > d.settings.page_size
    rows = rows[: d.settings.page_size]
    filters = {k: v for k, v in (("queue", queue), ("status", status), ("key", key)) if v}
    next_url = None
    if more:
        last = rows[-1]
        cursor = {"after_at": last.created_at.isoformat(), "after_id": last.run_id}
        next_url = "/runs?" + urllib.parse.urlencode({**filters, **cursor})
    return {
        "runs": rows,
        "filters": filters,
        "statuses": STATUSES,
        "searched": wanted,
        "paged": after_at is not None,
        "first_url": "/runs?" + urllib.parse.urlencode(filters),
        "next_url": next_url,
    }


async def run(d: Dashboard, request: Request) -> dict[str, Any]:
    run_id = request.query_params.get("id") or ""
    if not run_id:
        raise Redirect("/runs")
    detail = await d.client.get_run(run_id)
    if detail is None:
        return {"run": None, "run_id": run_id, "attempts": [], "steps": [], "lanes": {}}
    attempts = await d.client.run_attempts(run_id, max_rows=RUN_PAGE_ROWS)
    steps = await d.client.run_steps(run_id, max_rows=RUN_PAGE_ROWS)
    processes = []
    if str(detail.status) == "running":
        # Not through a sharded install's proxy (each shard has its own).
        with contextlib.suppress(psycopg.errors.FeatureNotSupported):
            processes = await d.client.list_processes()
    lanes = {
        lane: await d.client.run_ledger_events(run_id, lane=lane, max_rows=RUN_PAGE_ROWS)
        for lane in LANES
    }
    return {
        "run": detail,
        "run_id": run_id,
        "attempts": attempts,
        "dead_holder": presumed_dead_holder(attempts, processes),
        "steps": steps,
        "lanes": lanes,
        "blocked": [
            lane for lane, events in lanes.items() if any(str(e.state) == "failed" for e in events)
        ],
        "history": present.attempt_history(detail, attempts),
        "retryable": str(detail.status) in ("failed", "cancelled"),
        "live": str(detail.status) in ("queued", "running", "waiting"),
        "page_rows": RUN_PAGE_ROWS,
    }


async def deliveries(d: Dashboard, request: Request) -> dict[str, Any]:
    q = request.query_params
    lane = q.get("lane") or None
    if lane is not None and lane not in LANES:
        raise errors.InvalidArgument(f"lane must be one of {', '.join(LANES)}")
    after_run = q.get("after_run") or None
    after_lane = q.get("after_lane") or None
    heads = await d.client.list_blocked_heads(
        lane=lane,
        after_run_id=after_run,
        after_lane=after_lane if after_run else None,
        max_rows=d.settings.page_size + 1,
    )
    more = len(heads) > d.settings.page_size
    heads = heads[: d.settings.page_size]
    base = {"lane": lane} if lane else {}
    next_url = None
    if more:
        cursor = {"after_run": heads[-1].run_id, "after_lane": str(heads[-1].lane)}
        next_url = "/deliveries?" + urllib.parse.urlencode({**base, **cursor})
    return {
        "heads": heads,
        "lane": lane,
        "lanes": LANES,
        "paged": after_run is not None,
        "first_url": "/deliveries?" + urllib.parse.urlencode(base),
        "next_url": next_url,
    }


async def skip(d: Dashboard, request: Request) -> dict[str, Any]:
    """The confirmation step of a skip: the blocked head it would end, a
    reason to give, and the one form that posts it."""
    q = request.query_params
    run_id = (q.get("run_id") or "").strip()
    lane = q.get("lane") or ""
    if not run_id or lane not in LANES:
        raise errors.InvalidArgument(f"pass run_id and a lane ({', '.join(LANES)})")
    heads = await d.client.list_blocked_heads(run_id=run_id, lane=lane, max_rows=1)
    return {"run_id": run_id, "lane": lane, "head": heads[0] if heads else None}


async def processes(d: Dashboard, _request: Request) -> dict[str, Any]:
    return {"processes": await d.client.list_processes()}


async def schedules(d: Dashboard, request: Request) -> dict[str, Any]:
    after = request.query_params.get("after") or None
    rows = await d.client.list_schedules(after_name=after, max_rows=d.settings.page_size + 1)
    more = len(rows) > d.settings.page_size
    rows = rows[: d.settings.page_size]
    next_url = None
    if more:
        next_url = "/schedules?" + urllib.parse.urlencode({"after": rows[-1].name})
    return {"schedules": rows, "paged": after is not None, "next_url": next_url}


def _timestamp(raw: str | None) -> datetime | None:
    if not raw:
        return None
    try:
        return datetime.fromisoformat(raw)
    except ValueError:
        raise errors.InvalidArgument(f"after_at is not a timestamp: {raw!r}") from None
