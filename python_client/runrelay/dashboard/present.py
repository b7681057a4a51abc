"""How the dashboard's templates show values: times, ages, JSON, errors and
sparklines. Pure functions, registered as Jinja filters by app.py."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from markupsafe import Markup, escape

# Longer JSON is cut, so that one huge payload cannot make a page huge.
MAX_JSON_CHARS = 20_000


def when(moment: datetime | None) -> Markup:
    """A timestamp in UTC, to the second, with its age as a tooltip-free suffix."""
    if moment is None:
        return Markup("—")
    text = moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")
    return Markup('<time datetime="{}">{}</time>').format(moment.isoformat(), text)


def age(moment: datetime | None, now: datetime | None = None) -> str:
    """How long ago (or, in the future, 'in …'): 42s, 7m, 3h, 2d."""
    if moment is None:
        return "—"
    seconds = ((now or datetime.now(UTC)) - moment).total_seconds()
    text = seconds_text(abs(seconds))
    return f"in {text}" if seconds < 0 else f"{text} ago"


def seconds_text(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return (
                f"{seconds / size:.0f}{unit}"
                if seconds >= 10 * size
                else f"{seconds / size:.1f}{unit}"
            )
    return f"{seconds:.0f}s"


def pretty_json(value: Any) -> str:
    text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)
    if len(text) > MAX_JSON_CHARS:
        return text[:MAX_JSON_CHARS] + f"\n… ({len(text) - MAX_JSON_CHARS} more characters)"
    return text


def error_summary(error: Any) -> str:
    """One line for a stored error: `Type: message`, or its JSON."""
    if error is None:
        return ""
    if isinstance(error, dict):
        kind, message = error.get("type"), error.get("message")
        if kind or message:
            return ": ".join(str(part) for part in (kind, message) if part)
    line = json.dumps(error, ensure_ascii=False, default=str)
    return line if len(line) <= 200 else line[:199] + "…"


def traceback_of(error: Any) -> str | None:
    if isinstance(error, dict) and isinstance(error.get("traceback"), str):
        return str(error["traceback"])
    return None


def sparkline(
    completed: Sequence[int | None],
    failed: Sequence[int | None] = (),
    width: int = 120,
    height: int = 24,
) -> Markup:
    """An inline SVG of per-minute counts, oldest first: a line of completed
    runs and one of failed runs, on one scale (the busiest minute's); its
    title says the totals."""
    done = [v or 0 for v in completed]
    bad = [v or 0 for v in failed]
    peak = max([*done, *bad, 0])

    def points(counts: list[int]) -> str:
        step = width / max(len(counts) - 1, 1)
        return " ".join(
            f"{i * step:.1f},{height - 1 - (c / peak * (height - 2) if peak else 0):.1f}"
            for i, c in enumerate(counts)
        )

    title = (
        f"last {len(done)} minutes: {sum(done)} completed, {sum(bad)} failed; busiest minute {peak}"
    )
    # Failures first, so that completions draw over them where both are 0.
    lines = Markup("")
    if any(bad):
        lines += Markup('<polyline class="bad" points="{}"/>').format(points(bad))
    lines += Markup('<polyline class="done" points="{}"/>').format(points(done))
    return Markup(
        '<svg class="spark" viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" '
        'aria-label="{t}"><title>{t}</title>{lines}</svg>'
    ).format(w=width, h=height, t=title, lines=lines)


def per_minute(values: Sequence[int | None], minutes: int = 5) -> str:
    """The mean of the last complete minutes (the last entry is the current,
    partial minute, and is left out)."""
    complete = [v or 0 for v in values[:-1]][-minutes:]
    if not complete:
        return "—"
    mean = sum(complete) / len(complete)
    return f"{mean:.0f}/min" if mean >= 10 else f"{mean:.1f}/min"


def status_class(status: Any) -> Markup:
    return Markup("status status-{}").format(escape(str(status)))


def attempt_history(run: Any, attempts: Sequence[Any]) -> dict[str, Any]:
    """How a run's attempts read to a person: `counted`, the failures of the
    current series that count against max_attempts; `handed_back`, attempts
    released (a snooze, a worker's shutdown) that do not count;
    `error_is_history`, whether the run's stored error belongs to an earlier
    attempt of a run that went on (it is the run's error only once it
    failed), and `failed_attempt`, that attempt's number."""
    series = [a for a in attempts if a.attempt > run.series_start]
    failed = [a for a in attempts if str(a.status) in ("failed", "lost")]
    return {
        "counted": sum(str(a.status) in ("failed", "lost") for a in series),
        "handed_back": sum(str(a.status) == "released" for a in attempts),
        "error_is_history": run.error is not None and str(run.status) != "failed",
        "failed_attempt": failed[-1].attempt if failed else None,
    }
