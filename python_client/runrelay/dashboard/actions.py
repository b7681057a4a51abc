"""The dashboard's actions (cancel, retry, signal, requeue, skip, pause,
resume): `act` refuses what may not act, then each action reads its form,
makes one call, and says what happened."""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from .. import errors
from ..client import AsyncClient
from ..contract import LANES
from . import present
from .auth import _same_origin
from .sessions import COOKIE, same_token
from .state import (
    _UNAVAILABLE,
    BadForm,
    Dashboard,
    Refused,
    _form,
    _local,
    _refusal,
    _role_hint,
    log,
)

# The actions that call a producer function (cancel_run, signal_run) rather
# than an admin one: the login needs <schema>_producer for them.
PRODUCER_ACTIONS = frozenset({"cancel", "signal"})


async def act(d: Dashboard, request: Request) -> Response:
    name = request.path_params["action"]
    session = d.sessions.load(request.cookies.get(COOKIE))
    try:
        if not d.settings.read_write:
            raise Refused("this dashboard is read-only (start it with --read-write to act)")
        if session is None or not session.get("user"):
            raise Refused("log in to act")
        if not _same_origin(request):
            raise Refused("the request did not come from this dashboard's pages")
        form = await _form(request)
        if not same_token(form.get("csrf"), session["csrf"]):
            raise Refused("missing or wrong CSRF token")
        action = ACTIONS.get(name)
        if action is None:
            raise Refused(f"no action {name!r}", 404)
    except Refused as exc:
        log.warning("dashboard: refused %s: %s", name, exc)
        return _refusal(exc)
    actor = f"dashboard:{session['user']}"
    try:
        message = await action(d.client, form, actor)
        log.info("dashboard: %s: %s", actor, message)
    except (BadForm, errors.InvalidArgument) as exc:
        message = f"Not done: {exc}"
    except errors.PermissionDenied as exc:
        role = "producer" if name in PRODUCER_ACTIONS else "admin"
        message = f"Not done: {_role_hint(exc, f'{d.settings.schema}_{role}')}"
    except _UNAVAILABLE as exc:
        # Every action is safe to send again: cancel, retry, signal and skip
        # replay by their call id, the others are idempotent.
        log.warning("dashboard: %s: %s not done: %s", actor, name, exc)
        why = present.error_summary(str(exc))
        message = (
            f"Not done: the database is busy or unreachable ({why}). "
            "Sending the same form again is safe: it is applied once."
        )
    session["flash"] = message
    target = _local(form.get("next"))
    return d.with_cookie(RedirectResponse(target, status_code=303), request, session)


Action = Callable[[AsyncClient, dict[str, str], str], Awaitable[str]]


async def _cancel(c: AsyncClient, form: dict[str, str], actor: str) -> str:
    run_id = _required(form, "run_id")
    reason = _text(form, "reason") or f"cancelled by {actor}"
    outcome = await c.cancel_run(run_id, reason=reason, call_id=_call_id(form))
    return f"Cancel {run_id}: {outcome}"


async def _retry(c: AsyncClient, form: dict[str, str], actor: str) -> str:
    run_id = _required(form, "run_id")
    outcome = await c.retry_run(
        run_id, reason=_text(form, "reason"), requested_by=actor, call_id=_call_id(form)
    )
    return f"Retry {run_id}: {outcome}"


async def _signal(c: AsyncClient, form: dict[str, str], actor: str) -> str:
    run_id = _required(form, "run_id")
    name = _required(form, "name")
    raw = form.get("payload") or "{}"
    try:
        payload = json.loads(raw)
    except ValueError as exc:
        raise BadForm(f"payload is not JSON ({exc})") from None
    outcome = await c.signal_run(run_id, name, payload, call_id=_call_id(form))
    return f"Signal {name!r} to {run_id}: {outcome}"


async def _requeue(c: AsyncClient, form: dict[str, str], actor: str) -> str:
    run_id = _text(form, "run_id")
    lane = _text(form, "lane")
    if lane is not None and lane not in LANES:
        raise BadForm(f"lane must be one of {', '.join(LANES)}")
    lanes = await c.requeue_blocked_heads(run_id=run_id, lane=lane)
    events = sum(r.requeued for r in lanes)
    what = f"{run_id} {lane or 'every lane'}" if run_id else "every blocked lane"
    return f"Requeue {what}: {events} event(s) in {len(lanes)} lane(s) requeued"


async def _skip(c: AsyncClient, form: dict[str, str], actor: str) -> str:
    """Only from the confirmation page (/skip): its form alone carries
    confirmed=yes. The login the dashboard connects as is kept on the event
    (skipped_by); the dashboard user goes into the reason."""
    run_id = _required(form, "run_id")
    lane = _required(form, "lane")
    if lane not in LANES:
        raise BadForm(f"lane must be one of {', '.join(LANES)}")
    if form.get("confirmed") != "yes":
        raise BadForm("a skip is confirmed on its own page: open it with Skip… on the row")
    reason = f"{_required(form, 'reason')} ({actor})"
    rows = await c.skip_ledger_events(run_id, lane, reason, call_id=_call_id(form))
    if not any(r.outcome == "skipped" for r in rows):
        return f"Skip {run_id} {lane}: not blocked, nothing skipped"
    return f"Skip {run_id} {lane}: the failed head skipped; the lane delivers its successors"


async def _pause(c: AsyncClient, form: dict[str, str], actor: str) -> str:
    queue = _required(form, "queue")
    outcome = await c.pause_queue(queue, reason=_text(form, "reason"), requested_by=actor)
    return f"Pause {queue}: {outcome}"


async def _resume(c: AsyncClient, form: dict[str, str], actor: str) -> str:
    queue = _required(form, "queue")
    outcome = await c.resume_queue(queue)
    return f"Resume {queue}: {outcome}"


ACTIONS: dict[str, Action] = {
    "cancel": _cancel,
    "retry": _retry,
    "signal": _signal,
    "requeue": _requeue,
    "skip": _skip,
    "pause": _pause,
    "resume": _resume,
}


def _required(form: dict[str, str], field: str) -> str:
    value = (form.get(field) or "").strip()
    if not value:
        raise BadForm(f"{field} is required")
    return value


def _text(form: dict[str, str], field: str) -> str | None:
    value = (form.get(field) or "").strip()
    return value or None


def _call_id(form: dict[str, str]) -> uuid.UUID:
    raw = form.get("call_id")
    if not raw:
        raise BadForm("call_id is required (reload the page: its form is from an older version)")
    try:
        return uuid.UUID(raw)
    except ValueError:
        raise BadForm("call_id is not a uuid") from None
