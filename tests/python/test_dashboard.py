"""`runrelay dashboard` in a real browser: the command run from the installed
wheel, driven by Playwright in Debian's headless Chromium (/usr/bin/chromium,
installed by scripts/ensure_prereqs.sh; no browser is ever downloaded),
against the test database while a real Worker completes, fails and suspends
runs.

Every test checks what a page shows, or what an action did, against the
database itself, read through the test's own superuser connection: a page
that looks right but reads or writes the wrong rows fails. An action is
counted in the rows it writes (calls, signals, the ledger's run.* events,
paused_queues) and in a digest of every table, before and after, and again
after the same form is sent a second time.

Two dashboards serve the module, both behind one password and connected as a
login that is a member of runrelay_admin and runrelay_producer (as
docs/operations.md has an operator's login): one --read-write, one
read-only. A screenshot of each page lands in
.runrelay/screenshots/ (git-ignored) for a person to look at.
"""

from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from playwright.sync_api import (
    APIResponse,
    Browser,
    BrowserContext,
    Locator,
    Page,
    expect,
    sync_playwright,
)
from psycopg import sql
from psycopg_pool import ConnectionPool

from conftest import REPO, run_in_thread
from installed import Installed
from runrelay import Client
from runrelay.worker import Job, Suspend, Worker
from sqlapi import table_checksum

CHROMIUM = "/usr/bin/chromium"
# The machine's network is closed: Chromium must not try to reach anything of
# its own (updates, sync, field trials) while it shows the dashboard.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
PASSWORD = "a dashboard password for the tests"
PAGE_SIZE = 50
SCREENSHOTS = REPO / ".runrelay" / "screenshots"
# How long a page may take to show a change (a live update, a navigation).
WAIT_MS = 15_000
# The queue the Worker serves; runs of any other queue stay where they are.
WORK = "work"
USER = "ops"


# -- the dashboards ----------------------------------------------------------------------
@dataclass
class Dashboard:
    """One `runrelay dashboard` process and where it serves."""

    base: str  # http://127.0.0.1:PORT
    process: subprocess.Popen[str]
    log: Path
    checked: int = 0  # how much of its log the tests have read

    def new_log(self) -> str:
        text = self.log.read_text(errors="replace")
        new, self.checked = text[self.checked :], len(text)
        return new


def _start(installed: Installed, url: str, log: Path, *options: str) -> Dashboard:
    with log.open("w") as stderr:
        process = subprocess.Popen(
            [
                installed.runrelay, "dashboard", "--database-url", url,
                "--port", "0", "--page-size", str(PAGE_SIZE), *options,
            ],
            cwd=installed.home,
            env=installed.env(RUNRELAY_DASHBOARD_PASSWORD=PASSWORD),
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )  # fmt: skip
    assert process.stdout is not None
    with selectors.DefaultSelector() as ready:
        ready.register(process.stdout, selectors.EVENT_READ)
        line = process.stdout.readline() if ready.select(timeout=60) else ""
    served = re.fullmatch(r"runrelay dashboard \((read-write|read-only)\) on (http://\S+)/\n", line)
    if served is None:
        process.kill()
        process.wait()
        raise AssertionError(f"no URL from runrelay dashboard: {line!r}\n{log.read_text()}")
    expected = "read-write" if "--read-write" in options else "read-only"
    assert served.group(1) == expected
    return Dashboard(served.group(2), process, log)


def _stop(dashboard: Dashboard) -> None:
    dashboard.process.send_signal(signal.SIGTERM)
    try:
        dashboard.process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        dashboard.process.kill()
        dashboard.process.wait()
        log = dashboard.log.read_text()
        raise AssertionError(f"runrelay dashboard ignored SIGTERM\n{log}") from None


@dataclass(frozen=True)
class Login:
    role: str
    url: str


@pytest.fixture(scope="module")
def login(db_url: str) -> Iterator[Login]:
    """A login as docs/operations.md tells operators to make one for a
    dashboard: runrelay_admin (every read, retry, requeue, pause, resume) and
    runrelay_producer (cancel and signal are the producer's functions)."""
    role = f"rr_dashboard_{os.getpid()}"
    ident = sql.Identifier(role)
    with psycopg.connect(db_url, autocommit=True) as c:
        c.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(ident))
        c.execute(sql.SQL("CREATE ROLE {} LOGIN").format(ident))
        c.execute(sql.SQL("GRANT runrelay_admin, runrelay_producer TO {}").format(ident))
    info = psycopg.conninfo.conninfo_to_dict(db_url)
    info["user"] = role
    info.pop("password", None)
    yield Login(role, psycopg.conninfo.make_conninfo(**info))
    with psycopg.connect(db_url, autocommit=True) as c:
        c.execute(sql.SQL("DROP OWNED BY {}").format(ident))
        c.execute(sql.SQL("DROP ROLE {}").format(ident))


@pytest.fixture(scope="module")
def dashboards(
    installed: Installed, login: Login, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Dashboard]]:
    """{"rw": the read-write dashboard, "ro": the read-only one}."""
    logs = tmp_path_factory.mktemp("dashboard-logs")
    started: dict[str, Dashboard] = {}
    try:
        started["rw"] = _start(installed, login.url, logs / "rw.log", "--read-write")
        started["ro"] = _start(installed, login.url, logs / "ro.log")
        yield started
    finally:
        for dashboard in started.values():
            _stop(dashboard)


@pytest.fixture(scope="module")
def rw(dashboards: dict[str, Dashboard]) -> Dashboard:
    return dashboards["rw"]


@pytest.fixture(scope="module")
def ro(dashboards: dict[str, Dashboard]) -> Dashboard:
    return dashboards["ro"]


@pytest.fixture(autouse=True)
def _server_logs_stay_clean(dashboards: dict[str, Dashboard]) -> Iterator[None]:
    """Whatever a test did, neither dashboard may have failed inside (an
    exception is a 500 to some page, or a dead event stream)."""
    for dashboard in dashboards.values():
        dashboard.new_log()
    yield
    for name, dashboard in dashboards.items():
        assert dashboard.process.poll() is None, f"the {name} dashboard exited"
        new = dashboard.new_log()
        assert "Traceback" not in new and "ERROR" not in new, f"{name} dashboard:\n{new}"


# -- the browser -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    assert os.access(CHROMIUM, os.X_OK), f"no {CHROMIUM}: run bash scripts/ensure_prereqs.sh"
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@dataclass
class Tab:
    """A page in its own browser context (its own cookies), and what went
    wrong in it: console errors, uncaught exceptions, failed requests, and
    responses of 400 or more."""

    page: Page
    base: str
    problems: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)
    # Patterns of the problems a test causes on purpose (a 401 page, say).
    expected: list[str] = field(default_factory=list)

    def goto(self, path: str, status: int = 200) -> None:
        response = self.page.goto(self.base + path)
        assert response is not None and response.status == status, (path, response)

    def login(self, next_path: str = "/runs", name: str = USER) -> None:
        self.goto("/login?" + urllib.parse.urlencode({"next": next_path}))
        self.page.fill("input[name=name]", name)
        self.page.fill("input[name=password]", PASSWORD)
        with self.page.expect_navigation():
            self.page.click("form.login button[type=submit]")
        assert self.path() == next_path
        expect(self.page.locator("header .user")).to_have_text(name)

    def path(self) -> str:
        parts = urllib.parse.urlsplit(self.page.url)
        return parts.path + (f"?{parts.query}" if parts.query else "")

    def csrf(self) -> str:
        token = self.page.locator("input[name=csrf]").first.get_attribute("value")
        assert token
        return token

    def live(self) -> None:
        """Wait until the page follows the event stream."""
        expect(self.page.locator("body")).to_have_attribute("data-live-mode", "sse")

    def submit(self, button: Locator) -> dict[str, str]:
        """Click an action's button (accepting its confirm()), wait for the page
        it comes back to; the form's fields as the browser sent them."""
        form = button.locator("xpath=ancestor::form[1]")
        fields: dict[str, str] = form.evaluate("f => Object.fromEntries(new FormData(f))")
        with self.page.expect_navigation():
            button.click()
        return fields

    def post(
        self, path: str, fields: dict[str, str], origin: str | None = "", **headers: str
    ) -> APIResponse:
        """POST a form with this tab's cookies, as a resent form would: with
        the page's Origin unless told another (None: no Origin header);
        redirects not followed."""
        if origin is not None:
            headers["Origin"] = origin or self.base
        return self.page.request.post(
            self.base + path, form=fields, headers=headers, max_redirects=0
        )

    def errors(self) -> list[str]:
        """The problems, less the requests a page had in flight when it was
        left (its event stream, a live refresh: the browser drops them) and
        those the test expected."""
        left = [r"^failed: \S+ net::ERR_ABORTED$", *self.expected]
        return [p for p in self.problems if not any(re.search(e, p) for e in left)]

    def flash(self) -> str:
        return self.page.get_by_test_id("flash").inner_text()

    def run_ids(self) -> list[str]:
        return self.page.locator("table[data-testid=runs] tbody tr").evaluate_all(
            "rows => rows.map(r => r.dataset.runId)"
        )


def _watch(tab: Tab) -> None:
    page = tab.page

    def console(message: Any) -> None:
        if message.type == "error":
            tab.problems.append(f"console error: {message.text}")

    def response(r: Any) -> None:
        if r.status >= 400:
            tab.problems.append(f"{r.status} {r.request.method} {r.url}")

    def dialog(d: Any) -> None:
        tab.dialogs.append(d.message)
        d.accept()

    page.on("console", console)
    page.on("pageerror", lambda exc: tab.problems.append(f"uncaught: {exc}"))
    page.on("requestfailed", lambda r: tab.problems.append(f"failed: {r.url} {r.failure}"))
    page.on("response", response)
    page.on("dialog", dialog)


@pytest.fixture
def browse(browser: Browser) -> Iterator[Callable[..., Tab]]:
    """browse(dashboard, login=True, next_path="/runs") -> a Tab in a fresh
    browser context, logged in unless told not to."""
    contexts: list[BrowserContext] = []
    tabs: list[Tab] = []

    def open_tab(dashboard: Dashboard, login: bool = True, next_path: str = "/runs") -> Tab:
        context = browser.new_context(viewport={"width": 1360, "height": 900})
        context.set_default_timeout(WAIT_MS)
        contexts.append(context)
        tab = Tab(context.new_page(), dashboard.base)
        _watch(tab)
        tabs.append(tab)
        if login:
            tab.login(next_path)
        return tab

    yield open_tab
    for context in contexts:
        context.close()
    # Whatever else a test checked: no script error, no failed request, no
    # error status in any page it opened, but for what it caused on purpose.
    errors = [p for tab in tabs for p in tab.errors()]
    assert errors == [], errors


# -- the database and a real worker --------------------------------------------------------
def _handler(job: Job) -> Any:
    kind = job.payload.get("kind", "ok") if isinstance(job.payload, dict) else "ok"
    if kind == "boom":
        raise ValueError(f"boom in {job.run_id}")
    if kind == "wait" and job.resume is None:
        raise Suspend.event("go")
    return {"kind": kind, "resume": job.resume}


StartWorker = Callable[..., Worker]


@pytest.fixture
def start_worker(db: psycopg.Connection, db_url: str) -> Iterator[StartWorker]:
    """start_worker(until={run_id: status, ...}) -> a Worker running _handler
    on the WORK queue in a thread, once those runs have those statuses;
    stopped (and its failure raised) after the test."""
    pool = ConnectionPool(db_url, min_size=1, max_size=4, kwargs={"autocommit": True})
    running: list[tuple[Worker, Any, Any]] = []

    def start(until: dict[str, str] | None = None) -> Worker:
        worker = Worker(
            Client(pool),
            _handler,
            queues=[WORK],
            concurrency=4,
            poll_interval=0.1,
            heartbeat_every=1.0,
            maintenance=False,
            shutdown_grace=5,
        )
        thread, done = run_in_thread(worker)
        running.append((worker, thread, done))
        if until:
            _until(_statuses_are(db, **until), f"the worker took the runs to {until}")
        return worker

    with pool:
        yield start
        for worker, thread, done in running:
            worker.stop()
            thread.join(15)
            done.result(timeout=1)


def _until(check: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    """Wait for the database to reach a state the test then builds on."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached in {timeout:.0f}s: {what}")
        time.sleep(0.05)


def _status(db: psycopg.Connection, run_id: str) -> str | None:
    row = db.execute("SELECT status FROM runrelay.runs WHERE run_id = %s", (run_id,)).fetchone()
    return None if row is None else str(row[0])


def _statuses_are(db: psycopg.Connection, **wanted: str) -> Callable[[], bool]:
    return lambda: all(_status(db, run_id) == s for run_id, s in wanted.items())


def _count(db: psycopg.Connection, query: str, *args: Any) -> int:
    row = db.execute(query, args).fetchone()
    assert row is not None
    return int(row[0])


def _ids(db: psycopg.Connection, where: str = "TRUE", *args: Any) -> list[str]:
    """Run ids in the runs page's order: newest first, then run_id descending."""
    rows = db.execute(
        f"SELECT run_id FROM runrelay.runs WHERE {where} ORDER BY created_at DESC, run_id DESC",
        args,
    ).fetchall()
    return [r[0] for r in rows]


def _events(db: psycopg.Connection, run_id: str, type_: str) -> int:
    return _count(
        db, "SELECT count(*) FROM runrelay.ledger_events WHERE run_id = %s AND type = %s",
        run_id, type_,
    )  # fmt: skip


def _calls(db: psycopg.Connection, run_id: str, function: str) -> int:
    return _count(
        db, "SELECT count(*) FROM runrelay.calls WHERE run_id = %s AND function_name = %s",
        run_id, function,
    )  # fmt: skip


def _block(client: Client, run_id: str, lane: str = "lifecycle") -> int:
    """Make the head of a run's lane fail for good: the lane is blocked. The event id."""
    (head,) = client.claim_ledger("relay-1", lane=lane, run_id=run_id)
    (failure,) = client.fail_ledger(
        "relay-1", [head.event_id], {"type": "HTTPError", "message": "410 Gone"}, permanent=True
    )
    assert failure.outcome == "blocked"
    return head.event_id


def _blocked_lanes(db: psycopg.Connection) -> list[tuple[str, str]]:
    rows = db.execute(
        "SELECT run_id, lane FROM runrelay.ledger_lanes WHERE blocked ORDER BY run_id, lane"
    ).fetchall()
    return [(r[0], r[1]) for r in rows]


def _finish(client: Client, run_id: str, queue: str, fail: bool = False) -> None:
    """Complete (or fail for good) one run of a queue the Worker does not serve."""
    (attempt,) = client.claim_attempts("test-hand", [queue])
    assert attempt.run_id == run_id
    if fail:
        client.fail_attempt(**attempt.fence, error={"type": "KeyError", "message": "'sku'"})
    else:
        client.complete_attempt(**attempt.fence, result={"done": True})


def _waiting_run(db: psycopg.Connection, start_worker: StartWorker, run_id: str) -> None:
    """A run of WORK that the Worker suspended to wait for an event."""
    Client(db).enqueue_run(run_id, queue=WORK, payload={"kind": "wait"})
    start_worker(until={run_id: "waiting"})


def _sent_again_changes_nothing(
    db: psycopg.Connection, tab: Tab, action: str, fields: dict[str, str]
) -> APIResponse:
    """The form of an action that was applied, sent again as a double click or
    a resent POST would: a redirect, and no row of any table changes."""
    after = table_checksum(db)
    again = tab.post(f"/actions/{action}", fields)
    assert again.status == 303
    assert table_checksum(db) == after
    return again


def _fits_the_window(page: Page) -> None:
    """Nothing on the page makes it scroll sideways."""
    wide = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    assert wide[0] <= wide[1], f"{page.url} is {wide[0]}px wide in a {wide[1]}px window"


def _screenshot(tab: Tab, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    tab.page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


def _seed_everything(db: psycopg.Connection, start_worker: StartWorker) -> Client:
    """Runs in every state, from a real Worker where a worker would do it, a
    blocked lane and a schedule."""
    client = Client(db)
    db.execute("UPDATE runrelay.settings SET retry_base_seconds = 0.05")
    client.enqueue_runs(
        [{"run_id": f"ok-{i}", "queue": WORK, "payload": {"kind": "ok"}} for i in range(1, 7)]
        + [{"run_id": "boom-1", "queue": WORK, "payload": {"kind": "boom"}, "max_attempts": 2}]
        + [{"run_id": "wait-1", "queue": WORK, "payload": {"kind": "wait"}}]
    )
    client.enqueue_runs(
        [{"run_id": f"mail-{i}", "queue": "email", "priority": i} for i in range(1, 5)]
        + [{"run_id": f"inv-{i}", "queue": "billing", "concurrency_key": "acct-7"} for i in (1, 2)]
    )
    client.enqueue_run("later-1", queue="email", run_at=datetime.now(UTC) + timedelta(hours=1))
    client.enqueue_run("hook-1", queue="webhooks", payload={"url": "https://example.invalid/h"})
    _block(client, "hook-1")
    client.upsert_schedule("nightly-report", "0 3 * * *", time_zone="Europe/Paris", queue="reports")
    start_worker()
    _until(
        _statuses_are(db, **{f"ok-{i}": "completed" for i in range(1, 7)}, **{"boom-1": "failed"}),
        "the worker completed ok-* and failed boom-1",
    )
    _until(_statuses_are(db, **{"wait-1": "waiting"}), "wait-1 waits for its event")
    return client


# -- every page ----------------------------------------------------------------------------
def test_every_page_renders_from_the_database_without_errors(
    db: psycopg.Connection, rw: Dashboard, browse: Callable[..., Tab], start_worker: StartWorker
) -> None:
    _seed_everything(db, start_worker)

    def visit(path: str, name: str, live: bool = True, login: bool = True) -> Tab:
        tab = browse(rw, login=login)
        # Off the page the login landed on first: its event stream ends
        # (aborted, as at any navigation), and is not this page's problem.
        tab.page.goto("about:blank")
        tab.problems.clear()
        tab.goto(path)
        if live:
            tab.live()
        _screenshot(tab, name)
        _fits_the_window(tab.page)
        assert tab.problems == [], (path, tab.problems)
        return tab

    runs = visit("/runs", "runs")
    assert runs.run_ids() == _ids(db)
    assert runs.page.get_by_test_id("mode").inner_text() == "read-write"

    run = visit("/run?id=boom-1", "run")
    expect(run.page.locator("h1")).to_contain_text("boom-1")
    attempts = db.execute(
        "SELECT attempt FROM runrelay.attempts WHERE run_id = 'boom-1' ORDER BY attempt"
    ).fetchall()
    shown = run.page.locator("table[data-testid=attempts] tbody tr").evaluate_all(
        "rows => rows.map(r => Number(r.dataset.attempt))"
    )
    assert shown == [a[0] for a in attempts] == [1, 2]

    deliveries = visit("/deliveries", "deliveries")
    shown_heads = deliveries.page.locator("table[data-testid=blocked] tbody tr").evaluate_all(
        "rows => rows.map(r => [r.dataset.runId, r.dataset.lane])"
    )
    assert [tuple(h) for h in shown_heads] == _blocked_lanes(db) == [("hook-1", "lifecycle")]

    schedules = visit("/schedules", "schedules")
    names = [r[0] for r in db.execute("SELECT name FROM runrelay.schedules ORDER BY name")]
    shown_names = schedules.page.locator("table[data-testid=schedules] tbody tr").evaluate_all(
        "rows => rows.map(r => r.dataset.schedule)"
    )
    assert shown_names == names == ["nightly-report"]

    visit("/login", "login", live=False, login=False)

    health = runs.page.request.get(rw.base + "/healthz")
    assert health.status == 200
    assert health.json()["ok"] is True and health.json()["listening"] is True

    # The overview last: its counts are the database's, queue by queue.
    overview = visit("/", "overview")
    _assert_overview_matches(db, overview.page)


def _assert_overview_matches(db: psycopg.Connection, page: Page) -> None:
    expected = {
        queue: {
            "queued": str(queued),
            "scheduled": str(scheduled),
            "held_by_key": str(held),
            "running": str(running),
            "waiting": str(waiting),
            "completed": str(completed),
            "failed": str(failed),
        }
        for queue, queued, scheduled, held, running, waiting, completed, failed in db.execute(
            "SELECT queue,"
            " count(*) FILTER (WHERE status = 'queued' AND NOT key_held AND run_at <= now()),"
            " count(*) FILTER (WHERE status = 'queued' AND NOT key_held AND run_at > now()),"
            " count(*) FILTER (WHERE status = 'queued' AND key_held),"
            " count(*) FILTER (WHERE status = 'running'),"
            " count(*) FILTER (WHERE status = 'waiting'),"
            " count(*) FILTER (WHERE status = 'completed'"
            "   AND finished_at > now() - interval '1 hour'),"
            " count(*) FILTER (WHERE status = 'failed' AND finished_at > now() - interval '1 hour')"
            " FROM runrelay.runs GROUP BY queue ORDER BY queue"
        )
    }
    table = page.get_by_test_id("queues")
    shown_queues = table.locator("tbody tr").evaluate_all("rows => rows.map(r => r.dataset.queue)")
    assert shown_queues == sorted(expected)
    for queue, cells in expected.items():
        row = table.locator(f'tr[data-queue="{queue}"]')
        shown = {col: row.locator(f"td[data-col={col}]").inner_text().strip() for col in cells}
        assert shown == cells, queue
    blocked = dict(
        db.execute(
            "SELECT lane, count(*) FILTER (WHERE blocked) FROM runrelay.ledger_lanes GROUP BY lane"
        ).fetchall()
    )
    lanes = page.get_by_test_id("lanes")
    for lane in ("lifecycle", "observability"):
        cell = lanes.locator(f'tr[data-lane="{lane}"] td[data-col=blocked]')
        assert cell.inner_text().strip() == str(blocked.get(lane, 0)), lane


# -- runs: filters, search, pages ---------------------------------------------------------
def test_runs_filters_and_the_id_search(
    db: psycopg.Connection, rw: Dashboard, browse: Callable[..., Tab]
) -> None:
    client = Client(db)
    client.enqueue_runs(
        [{"run_id": f"e-{i}", "queue": "email"} for i in range(1, 5)]
        + [{"run_id": f"k-{i}", "queue": "email", "concurrency_key": "acct-7"} for i in (1, 2)]
        + [{"run_id": f"b-{i}", "queue": "billing", "max_attempts": 1} for i in range(1, 5)]
        + [{"run_id": "k-3", "queue": "billing", "concurrency_key": "acct-7"}]
    )
    _finish(client, "b-1", "billing", fail=True)
    _finish(client, "b-2", "billing")
    tab = browse(rw)

    def apply(queue: str = "", status: str = "", key: str = "") -> list[str]:
        tab.page.get_by_test_id("filter-queue").fill(queue)
        tab.page.get_by_test_id("filter-status").select_option(status)
        tab.page.get_by_test_id("filter-key").fill(key)
        with tab.page.expect_navigation():
            tab.page.get_by_test_id("apply-filters").click()
        given = {k: v for k, v in (("queue", queue), ("status", status), ("key", key)) if v}
        assert urllib.parse.parse_qs(urllib.parse.urlsplit(tab.page.url).query) == {
            k: [v] for k, v in given.items()
        }
        return tab.run_ids()

    assert tab.run_ids() == _ids(db) and len(_ids(db)) == 11
    assert apply(queue="email") == _ids(db, "queue = 'email'")
    assert len(_ids(db, "queue = 'email'")) == 6
    assert apply(status="failed") == _ids(db, "status = 'failed'") == ["b-1"]
    assert apply(key="acct-7") == _ids(db, "concurrency_key = 'acct-7'") == ["k-3", "k-2", "k-1"]
    assert apply(queue="billing", status="queued") == _ids(
        db, "queue = 'billing' AND status = 'queued'"
    ) == ["k-3", "b-4", "b-3"]  # fmt: skip
    assert apply(queue="billing", status="completed", key="acct-7") == []
    expect(tab.page.get_by_test_id("no-runs")).to_be_visible()

    # Found: the run's own page. Missing: said so, on the runs page.
    tab.page.get_by_test_id("search-id").fill("b-2")
    with tab.page.expect_navigation():
        tab.page.get_by_test_id("search-id").press("Enter")
    assert tab.path() == "/run?id=b-2"
    assert _status(db, "b-2") == "completed"
    expect(tab.page.locator("span.status").first).to_have_text("completed")

    tab.goto("/runs")
    tab.page.get_by_test_id("search-id").fill("no-such-run")
    with tab.page.expect_navigation():
        tab.page.get_by_test_id("search-id").press("Enter")
    assert tab.path() == "/runs?id=no-such-run"
    assert _count(db, "SELECT count(*) FROM runrelay.runs WHERE run_id = 'no-such-run'") == 0
    expect(tab.page.get_by_test_id("not-found")).to_have_text("No run with id “no-such-run”.")
    tab.goto("/run?id=no-such-run")
    expect(tab.page.get_by_test_id("not-found")).to_contain_text("No run with this id")


def test_markup_in_a_run_is_shown_as_text_and_its_id_round_trips(
    db: psycopg.Connection, rw: Dashboard, browse: Callable[..., Tab]
) -> None:
    """A run id, queue, key and error full of markup and URL syntax: every
    page shows them as text (no script runs, no element is injected), links
    and the action's return address carry the id intact, and the cancel
    reaches that run."""
    hostile = "<img src=x onerror=alert(1)> ü/?a=1&b=%20#x 'q\""
    client = Client(db)
    client.enqueue_run(
        hostile, queue="<b>q</b>", concurrency_key="<i>k</i>", payload={"html": "<script>"}
    )
    client.enqueue_run("plain-1", queue="<b>q</b>", max_attempts=1, priority=100)  # claimed first
    _finish(client, "plain-1", "<b>q</b>", fail=True)
    db.execute(
        "UPDATE runrelay.runs SET error = %s WHERE run_id = 'plain-1'",
        (psycopg.types.json.Jsonb({"type": "<svg onload=alert(2)>", "message": "</td>&amp;"}),),
    )
    tab = browse(rw, next_path="/runs?" + urllib.parse.urlencode({"queue": "<b>q</b>"}))
    page = tab.page
    assert tab.run_ids() == _ids(db, "queue = '<b>q</b>'") == ["plain-1", hostile]
    expect(page.locator("table[data-testid=runs] td.error-text").first).to_have_text(
        "<svg onload=alert(2)>: </td>&amp;"
    )
    assert page.locator("main img, main b, main i, main svg:not(.spark)").count() == 0

    with page.expect_navigation():
        page.locator("table[data-testid=runs] td.id a").nth(1).click()
    assert urllib.parse.parse_qs(urllib.parse.urlsplit(page.url).query) == {"id": [hostile]}
    expect(page.locator("h1 .id")).to_have_text(hostile)
    tab.submit(page.locator("button[data-action=cancel]"))
    assert tab.dialogs == [f"Cancel run {hostile}?"]
    assert urllib.parse.parse_qs(urllib.parse.urlsplit(page.url).query) == {"id": [hostile]}
    assert tab.flash() == f"Cancel {hostile}: cancelled"
    assert _status(db, hostile) == "cancelled"
    assert tab.errors() == [] and page.locator("main img").count() == 0


def test_runs_pages_follow_the_keyset_without_repeating_or_skipping_a_row(
    db: psycopg.Connection, rw: Dashboard, browse: Callable[..., Tab]
) -> None:
    client = Client(db)
    # Two batches: within each, every run has the same created_at, so the
    # pages must break ties by run_id; other queues' runs are interleaved.
    client.enqueue_runs([{"run_id": f"bulk-{i:03d}", "queue": "bulk"} for i in range(70)])
    client.enqueue_runs([{"run_id": f"other-{i}", "queue": "other"} for i in range(5)])
    client.enqueue_runs([{"run_id": f"bulk-{i:03d}", "queue": "bulk"} for i in range(70, 130)])
    expected = _ids(db, "queue = 'bulk'")
    assert len(expected) == 130
    tab = browse(rw, next_path="/runs?queue=bulk")

    pages = [tab.run_ids()]
    expect(tab.page.get_by_test_id("first-page")).to_have_count(0)
    while tab.page.get_by_test_id("next-page").count():
        with tab.page.expect_navigation():
            tab.page.get_by_test_id("next-page").click()
        assert "queue=bulk" in tab.page.url
        pages.append(tab.run_ids())
        expect(tab.page.get_by_test_id("first-page")).to_have_count(1)
    assert [len(p) for p in pages] == [PAGE_SIZE, PAGE_SIZE, 130 - 2 * PAGE_SIZE]
    assert [run_id for p in pages for run_id in p] == expected

    with tab.page.expect_navigation():
        tab.page.get_by_test_id("first-page").click()
    assert tab.run_ids() == pages[0]


# -- one run -------------------------------------------------------------------------------
def test_the_run_page_reads_an_earlier_attempts_error_and_the_attempt_counts_plainly(
    db: psycopg.Connection, rw: Dashboard, browse: Callable[..., Tab]
) -> None:
    """A run that failed once, was snoozed once and completed: its stored
    error is shown as an earlier attempt's, and the counts say which
    attempts count against max_attempts."""
    client = Client(db)
    client.enqueue_run("flaky", queue=WORK, max_attempts=3)
    (first,) = client.claim_attempts("w", [WORK])
    now = db.execute("SELECT now()").fetchone()[0]
    client.fail_attempt(**first.fence, error={"type": "Timeout", "message": "upstream slow"},
                        retry_at=now)  # fmt: skip
    (second,) = client.claim_attempts("w", [WORK])
    client.release_attempt(**second.fence, reason="Snooze: rate limited")
    (third,) = client.claim_attempts("w", [WORK])
    client.complete_attempt(**third.fence)

    tab = browse(rw, next_path="/run?id=flaky")
    page = tab.page
    expect(page.get_by_test_id("run-error")).to_have_count(0)
    earlier = page.get_by_test_id("earlier-error")
    expect(earlier).to_contain_text("attempt 1 failed; the run went on")
    expect(page.get_by_test_id("run-attempts")).to_contain_text(
        "3 started; 1 of 3 allowed failures used; 1 handed back, not counted"
    )


def test_the_run_page_shows_attempts_the_traceback_and_events_per_lane(
    db: psycopg.Connection, rw: Dashboard, browse: Callable[..., Tab], start_worker: StartWorker
) -> None:
    client = Client(db)
    db.execute("UPDATE runrelay.settings SET retry_base_seconds = 0.05")
    client.enqueue_run("boom-2", queue=WORK, payload={"kind": "boom"}, max_attempts=2)
    client.append_events(
        "boom-2", [{"type": f"log.line.{i}", "lane": "observability"} for i in range(3)]
    )
    start_worker(until={"boom-2": "failed"})
    # A relay delivered the first lifecycle event and gave up on the second;
    # the first observability event is delivered, the rest wait.
    (first,) = client.claim_ledger("relay-1", run_id="boom-2")
    client.ack_ledger("relay-1", "boom-2", [first.event_id])
    _block(client, "boom-2")
    (log_line,) = client.claim_ledger("relay-1", lane="observability", run_id="boom-2")
    client.ack_ledger("relay-1", "boom-2", [log_line.event_id])

    tab = browse(rw, next_path="/run?id=boom-2")
    tab.live()
    page = tab.page

    # Attempts: the database's, each failed with its own traceback.
    attempts = db.execute(
        "SELECT attempt, status, error FROM runrelay.attempts WHERE run_id = 'boom-2'"
        " ORDER BY attempt"
    ).fetchall()
    assert [(a, s) for a, s, _ in attempts] == [(1, "failed"), (2, "failed")]
    for attempt, status, error in attempts:
        row = page.locator(f"table[data-testid=attempts] tr[data-attempt='{attempt}']")
        expect(row.locator("span.status")).to_have_text(status)
        row.locator("summary", has_text="Traceback").click()
        shown = row.locator("pre.traceback").inner_text()
        assert shown.strip() == error["traceback"].strip()
        assert shown.rstrip().endswith("ValueError: boom in boom-2")
        assert 'raise ValueError(f"boom in {job.run_id}")' in shown

    # The run's stored error, with its traceback.
    (stored,) = db.execute("SELECT error FROM runrelay.runs WHERE run_id = 'boom-2'").fetchone()
    box = page.get_by_test_id("run-error")
    expect(box.locator(".error-text")).to_have_text("ValueError: boom in boom-2")
    box.locator("summary").click()
    assert box.locator("pre.traceback").inner_text().strip() == stored["traceback"].strip()

    # Events per lane, each with its delivery state as the ledger view reads it.
    for lane in ("lifecycle", "observability"):
        expected = [
            (str(seq), state)
            for seq, state in db.execute(
                "SELECT seq, state FROM runrelay.ledger WHERE run_id = 'boom-2' AND lane = %s"
                " ORDER BY seq",
                (lane,),
            )
        ]
        rows = page.locator(f"table[data-testid=events-{lane}] tbody tr")
        shown = rows.evaluate_all(
            "rows => rows.map(r => [r.dataset.seq, r.querySelector('span.status').textContent])"
        )
        assert [tuple(s) for s in shown] == expected, lane
    lifecycle_states = [s for _, s in db.execute(
        "SELECT seq, state FROM runrelay.ledger WHERE run_id = 'boom-2' AND lane = 'lifecycle'"
        " ORDER BY seq"
    )]  # fmt: skip
    assert lifecycle_states[:2] == ["delivered", "failed"] and "pending" in lifecycle_states
    failed_row = page.locator("table[data-testid=events-lifecycle] tbody tr").nth(1)
    expect(failed_row).to_contain_text("HTTPError: 410 Gone")
    # What a read-write session may do with it: retry it, requeue its blocked lane.
    expect(page.locator("button[data-action=retry]")).to_have_count(1)
    expect(page.locator("button[data-action=requeue]")).to_have_text("Requeue blocked lifecycle")
    expect(page.locator("button[data-action=cancel]")).to_have_count(0)
    # Every traceback open, the page is still no wider than the window.
    _fits_the_window(page)
    _screenshot(tab, "run-failed")


# -- actions, each applied once -------------------------------------------------------------
def test_cancel_is_applied_once_even_when_the_form_is_sent_twice(
    db: psycopg.Connection, rw: Dashboard, browse: Callable[..., Tab], start_worker: StartWorker
) -> None:
    _waiting_run(db, start_worker, "wait-c")
    tab = browse(rw, next_path="/run?id=wait-c")
    before = table_checksum(db)

    fields = tab.submit(tab.page.locator("button[data-action=cancel]"))
    assert tab.dialogs == ["Cancel run wait-c?"]
    expect(tab.page.locator(".run-head .badge-bad")).to_contain_text("cancelled: cancelled by ")
    assert tab.path() == "/run?id=wait-c"
    assert tab.flash() == "Cancel wait-c: cancelled"
    assert _status(db, "wait-c") == "cancelled"
    assert (_events(db, "wait-c", "run.cancelled"), _calls(db, "wait-c", "cancel_run")) == (1, 1)
    assert table_checksum(db) != before

    # The same form again: the first outcome, nothing new.
    again = _sent_again_changes_nothing(db, tab, "cancel", fields)
    assert again.headers["location"] == "/run?id=wait-c"
    assert (_events(db, "wait-c", "run.cancelled"), _calls(db, "wait-c", "cancel_run")) == (1, 1)
    # ... and says what the first one did (not "already_terminal").
    tab.goto(again.headers["location"])
    assert tab.flash() == "Cancel wait-c: cancelled"
    expect(tab.page.locator("span.status").first).to_have_text("cancelled")


def test_the_line_an_action_leaves_survives_a_live_refresh_of_the_page_it_left(
    db: psycopg.Connection, rw: Dashboard, browse: Callable[..., Tab]
) -> None:
    """The outcome of an action is shown once, on the page loaded after it,
    even when the page it was sent from refreshed itself in between, which
    the action's own notification makes likely: a refresh must not take it."""
    Client(db).enqueue_run("c-flash", queue="email")
    tab = browse(rw, next_path="/run?id=c-flash")
    tab.live()
    fields = tab.page.locator("form[action='/actions/cancel']").evaluate(
        "f => Object.fromEntries(new FormData(f))"
    )
    sent = tab.post("/actions/cancel", fields)
    assert sent.status == 303 and _status(db, "c-flash") == "cancelled"
    # The page still open refreshes itself, as dashboard.js does on an event.
    refreshed = tab.page.evaluate(
        "() => fetch(location.href, {headers: {'X-Requested-With': 'runrelay-live'}})"
        ".then(r => r.status)"
    )
    assert refreshed == 200
    tab.goto(sent.headers["location"])
    assert tab.flash() == "Cancel c-flash: cancelled"
    tab.goto("/run?id=c-flash")  # once
    expect(tab.page.get_by_test_id("flash")).to_have_count(0)


def test_an_action_the_login_may_not_call_says_which_role_it_needs(
    db: psycopg.Connection, rw: Dashboard, browse: Callable[..., Tab], login: Login
) -> None:
    """Cancel is a producer function: a login with runrelay_admin alone is
    told to grant runrelay_producer (not the admin role it already has), and
    nothing changes."""
    Client(db).enqueue_run("c-role", queue="email")
    tab = browse(rw, next_path="/run?id=c-role")
    before = table_checksum(db)
    role = sql.Identifier(login.role)
    db.execute(sql.SQL("REVOKE runrelay_producer FROM {}").format(role))
    try:
        tab.submit(tab.page.locator("button[data-action=cancel]"))
    finally:
        db.execute(sql.SQL("GRANT runrelay_producer TO {}").format(role))
    assert tab.flash() == (
        "Not done: permission denied for function cancel_run. The dashboard's database "
        "login needs runrelay_producer for this: grant it to the login."
    )
    assert table_checksum(db) == before
    assert _status(db, "c-role") == "queued"


def test_retry_is_applied_once_even_when_the_form_is_sent_twice(
    db: psycopg.Connection, rw: Dashboard, browse: Callable[..., Tab], start_worker: StartWorker
) -> None:
    Client(db).enqueue_run("boom-r", queue=WORK, payload={"kind": "boom"}, max_attempts=1)
    start_worker(until={"boom-r": "failed"})
    tab = browse(rw, next_path="/run?id=boom-r")

    fields = tab.submit(tab.page.locator("button[data-action=retry]"))
    assert tab.flash() == "Retry boom-r: retried"
    assert (_events(db, "boom-r", "run.retried"), _calls(db, "boom-r", "retry_run")) == (1, 1)
    (requested_by,) = db.execute(
        "SELECT payload ->> 'requested_by' FROM runrelay.ledger_events"
        " WHERE run_id = 'boom-r' AND type = 'run.retried'"
    ).fetchone()
    assert requested_by == f"dashboard:{USER}"
    # The worker runs it again, and it fails again: a second attempt, one retry.
    _until(
        lambda: (
            _count(db, "SELECT count(*) FROM runrelay.attempts WHERE run_id = 'boom-r'") == 2
            and _status(db, "boom-r") == "failed"
        ),
        "the retried run's second attempt failed",
    )

    _sent_again_changes_nothing(db, tab, "retry", fields)
    assert (_events(db, "boom-r", "run.retried"), _calls(db, "boom-r", "retry_run")) == (1, 1)
    assert _status(db, "boom-r") == "failed"


def test_signal_with_a_json_payload_is_stored_once_and_resumes_the_run(
    db: psycopg.Connection, rw: Dashboard, browse: Callable[..., Tab], start_worker: StartWorker
) -> None:
    _waiting_run(db, start_worker, "wait-s")
    tab = browse(rw, next_path="/run?id=wait-s")
    page = tab.page

    def signal_rows() -> list[tuple[str, Any]]:
        rows = db.execute(
            "SELECT name, payload FROM runrelay.signals WHERE run_id = 'wait-s' ORDER BY signal_id"
        ).fetchall()
        return [(r[0], r[1]) for r in rows]

    # A signal it does not wait for is stored.
    page.get_by_test_id("signal-name").fill("note")
    page.get_by_test_id("signal-payload").fill('{"colour": "blue", "n": [1, 2.5, null]}')
    fields = tab.submit(page.locator("button[data-action=signal]"))
    assert tab.flash() == "Signal 'note' to wait-s: stored"
    assert signal_rows() == [("note", {"colour": "blue", "n": [1, 2.5, None]})]

    _sent_again_changes_nothing(db, tab, "signal", fields)
    assert len(signal_rows()) == 1 and _calls(db, "wait-s", "signal_run") == 1
    after = table_checksum(db)

    # Not JSON: refused before any call, said so.
    page.get_by_test_id("signal-name").fill("note")
    page.get_by_test_id("signal-payload").fill("{colour: blue}")
    tab.submit(page.locator("button[data-action=signal]"))
    assert tab.flash().startswith("Not done: payload is not JSON")
    assert table_checksum(db) == after

    # A fresh form is a new call: the one the run waits for resumes it, and
    # the worker completes it with the payload.
    page.get_by_test_id("signal-name").fill("go")
    page.get_by_test_id("signal-payload").fill('{"approved": true}')
    tab.submit(page.locator("button[data-action=signal]"))
    assert tab.flash() == "Signal 'go' to wait-s: resumed"
    assert _calls(db, "wait-s", "signal_run") == 2
    _until(_statuses_are(db, **{"wait-s": "completed"}), "the worker completed wait-s")
    (result,) = db.execute("SELECT result FROM runrelay.runs WHERE run_id = 'wait-s'").fetchone()
    assert result["resume"] == {"name": "go", "payload": {"approved": True}}


def test_requeue_unblocks_one_lane_or_every_lane_once(
    db: psycopg.Connection, rw: Dashboard, browse: Callable[..., Tab]
) -> None:
    client = Client(db)
    for run_id in ("hook-1", "hook-2", "hook-3"):
        client.enqueue_run(run_id, queue="webhooks")
    client.append_events("hook-3", [{"type": "log", "lane": "observability"}])
    heads = {run_id: _block(client, run_id) for run_id in ("hook-1", "hook-2", "hook-3")}
    _block(client, "hook-3", lane="observability")
    assert _blocked_lanes(db) == [
        ("hook-1", "lifecycle"), ("hook-2", "lifecycle"),
        ("hook-3", "lifecycle"), ("hook-3", "observability"),
    ]  # fmt: skip

    def head(run_id: str) -> tuple[Any, int]:
        row = db.execute(
            "SELECT failed_at, delivery_attempts FROM runrelay.ledger_events WHERE event_id = %s",
            (heads[run_id],),
        ).fetchone()
        assert row is not None
        return row[0], row[1]

    # One run's lane, from the run's page.
    tab = browse(rw, next_path="/run?id=hook-1")
    fields = tab.submit(tab.page.locator("button[data-action=requeue]"))
    assert tab.flash() == "Requeue hook-1 lifecycle: 1 event(s) in 1 lane(s) requeued"
    assert head("hook-1") == (None, 0)
    assert ("hook-1", "lifecycle") not in _blocked_lanes(db) and len(_blocked_lanes(db)) == 3
    _sent_again_changes_nothing(db, tab, "requeue", fields)

    # One lane, from its row on the deliveries page.
    tab.goto("/deliveries")
    tab.live()
    row = tab.page.locator('table[data-testid=blocked] tr[data-run-id="hook-2"]')
    tab.submit(row.locator("button[data-action=requeue]"))
    assert tab.path() == "/deliveries"
    assert tab.flash() == "Requeue hook-2 lifecycle: 1 event(s) in 1 lane(s) requeued"
    assert _blocked_lanes(db) == [("hook-3", "lifecycle"), ("hook-3", "observability")]
    shown = tab.page.locator("table[data-testid=blocked] tbody tr").evaluate_all(
        "rows => rows.map(r => [r.dataset.runId, r.dataset.lane])"
    )
    assert [tuple(s) for s in shown] == _blocked_lanes(db)

    # Every blocked lane, after a confirm().
    fields = tab.submit(tab.page.get_by_role("button", name="Requeue every blocked lane"))
    assert tab.dialogs == ["Requeue the failed head of every blocked lane?"]
    assert tab.flash() == "Requeue every blocked lane: 2 event(s) in 2 lane(s) requeued"
    assert _blocked_lanes(db) == [] and head("hook-3") == (None, 0)
    expect(tab.page.get_by_test_id("no-blocked")).to_be_visible()
    _sent_again_changes_nothing(db, tab, "requeue", fields)


def _cut_connections(db: psycopg.Connection, login: Login) -> None:
    """End every session of the dashboards' login, as a restart of the
    database (or a proxy's idle timeout) does; they open new ones."""
    cut = [
        r[0]
        for r in db.execute(
            # In the select list, so only the rows of the login are ended.
            "SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
            (login.role,),
        )
    ]
    assert cut, "the dashboards had no session to cut"
    _until(
        lambda: _count(db, "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", cut) == 0,
        "the cut sessions ended",
    )


def test_an_action_outlives_cut_connections_and_says_when_the_database_is_busy(
    db: psycopg.Connection, rw: Dashboard, browse: Callable[..., Tab], login: Login
) -> None:
    """After its connections are cut the dashboard acts on fresh ones; an
    action that cannot take its locks in time says so on the page (and can
    be sent again), rather than failing the request."""
    client = Client(db)
    client.enqueue_run("hook-busy", queue="webhooks")
    _block(client, "hook-busy")
    tab = browse(rw)
    role = sql.Identifier(login.role)
    # The dashboards' next sessions wait at most 200 ms for a lock.
    db.execute(sql.SQL("ALTER ROLE {} SET lock_timeout = '200ms'").format(role))
    try:
        # Off any page while the connections are cut: a live refresh in
        # flight then would fail, and rightly so, but it is not under test.
        tab.page.goto("about:blank")
        _cut_connections(db, login)
        tab.goto("/run?id=hook-busy")
        with psycopg.connect(db.info.dsn) as holder:  # a transaction holding the lane
            holder.execute(
                "SELECT 1 FROM runrelay.ledger_lanes WHERE run_id = 'hook-busy' FOR UPDATE"
            )
            before = table_checksum(db)
            fields = tab.submit(tab.page.locator("button[data-action=requeue]"))
            assert tab.path() == "/run?id=hook-busy"
            assert tab.flash().startswith("Not done: the database is busy or unreachable")
            assert table_checksum(db) == before
            assert _blocked_lanes(db) == [("hook-busy", "lifecycle")]
        # The lane is free again: the same form now acts.
        assert tab.post("/actions/requeue", fields).status == 303
        assert _blocked_lanes(db) == []
    finally:
        tab.page.goto("about:blank")
        db.execute(sql.SQL("ALTER ROLE {} RESET lock_timeout").format(role))
        _cut_connections(db, login)
    tab.goto("/run?id=hook-busy")  # on fresh connections again
    expect(tab.page.locator("button[data-action=requeue]")).to_have_count(0)


def test_pause_and_resume_a_queue_from_the_overview_once_each(
    db: psycopg.Connection, rw: Dashboard, browse: Callable[..., Tab]
) -> None:
    client = Client(db)
    client.enqueue_runs([{"run_id": f"mail-{i}", "queue": "email"} for i in range(3)])
    tab = browse(rw, next_path="/")
    row = tab.page.locator('table[data-testid=queues] tr[data-queue="email"]')
    expect(row.get_by_test_id("paused")).to_have_count(0)

    def paused() -> list[tuple[str, str | None, str | None]]:
        rows = db.execute("SELECT queue, reason, paused_by FROM runrelay.paused_queues").fetchall()
        return [(r[0], r[1], r[2]) for r in rows]

    fields = tab.submit(row.locator("button[data-action=pause]"))
    assert tab.dialogs == ["Pause queue email? Workers stop claiming its runs."]
    assert tab.path() == "/"
    assert tab.flash() == "Pause email: paused"
    assert paused() == [("email", None, f"dashboard:{USER}")]
    expect(row.get_by_test_id("paused")).to_be_visible()
    _sent_again_changes_nothing(db, tab, "pause", fields)  # paused_at included: not paused again

    fields = tab.submit(row.locator("button[data-action=resume]"))
    assert tab.flash() == "Resume email: resumed"
    assert paused() == []
    expect(row.get_by_test_id("paused")).to_have_count(0)
    expect(row.locator("button[data-action=pause]")).to_be_visible()
    _sent_again_changes_nothing(db, tab, "resume", fields)
    assert _count(db, "SELECT count(*) FROM runrelay.runs WHERE status = 'queued'") == 3


# -- who may act -----------------------------------------------------------------------------
def test_a_read_only_dashboard_shows_no_action_and_refuses_a_forged_one(
    db: psycopg.Connection, ro: Dashboard, browse: Callable[..., Tab], start_worker: StartWorker
) -> None:
    client = Client(db)
    client.enqueue_runs(
        [
            {"run_id": "wait-ro", "queue": WORK, "payload": {"kind": "wait"}},
            {"run_id": "boom-ro", "queue": WORK, "payload": {"kind": "boom"}, "max_attempts": 1},
        ]
    )
    client.enqueue_run("hook-ro", queue="webhooks")
    _block(client, "hook-ro")
    start_worker(until={"wait-ro": "waiting", "boom-ro": "failed"})
    tab = browse(ro)
    expect(tab.page.get_by_test_id("mode")).to_have_text("read-only")
    for path in ("/runs", "/run?id=wait-ro", "/run?id=boom-ro", "/run?id=hook-ro", "/deliveries",
                 "/"):  # fmt: skip
        tab.goto(path)
        expect(tab.page.locator("main")).to_be_visible()
        assert tab.page.locator("form[action^='/actions/'], button[data-action]").count() == 0, path
    expect(tab.page.get_by_test_id("signal-form")).to_have_count(0)
    before = table_checksum(db)

    forged = tab.post(
        "/actions/cancel",
        {"csrf": tab.csrf(), "run_id": "wait-ro", "call_id": str(uuid.uuid4()), "next": "/"},
    )
    assert forged.status == 403
    assert "read-only" in forged.text() and "Nothing was changed" in forged.text()
    assert table_checksum(db) == before
    assert _status(db, "wait-ro") == "waiting"


def test_a_post_without_the_token_login_or_origin_is_refused_and_changes_nothing(
    db: psycopg.Connection, rw: Dashboard, browse: Callable[..., Tab]
) -> None:
    Client(db).enqueue_run("victim", queue="email")
    tab = browse(rw, next_path="/run?id=victim")
    form = {
        "csrf": tab.csrf(),
        "run_id": "victim",
        "call_id": str(uuid.uuid4()),
        "next": "/run?id=victim",
    }
    before = table_checksum(db)
    without_token = {k: v for k, v in form.items() if k != "csrf"}
    refused = {
        "no CSRF token": tab.post("/actions/cancel", without_token),
        "a wrong CSRF token": tab.post("/actions/cancel", {**form, "csrf": "x" * 43}),
        "another site's origin": tab.post("/actions/cancel", form, "http://evil.example"),
        "another site, no Origin": tab.post(
            "/actions/cancel", form, None, **{"Sec-Fetch-Site": "cross-site"}
        ),
    }
    # Not logged in: an anonymous session's own (valid) token is not enough.
    stranger = browse(rw, login=False)
    stranger.goto("/login")
    refused["no login"] = stranger.post("/actions/cancel", {**form, "csrf": stranger.csrf()})
    for why, response in refused.items():
        assert response.status == 403, why
        assert "Nothing was changed" in response.text(), why
        assert table_checksum(db) == before, why
    assert _status(db, "victim") == "queued"

    # The same form, sent properly, does act: the refusals were the checks'.
    done = tab.post("/actions/cancel", form)
    assert done.status == 303
    assert _status(db, "victim") == "cancelled"


def test_login_with_a_wrong_password_is_401_and_logout_ends_the_session(
    db: psycopg.Connection, rw: Dashboard, browse: Callable[..., Tab]
) -> None:
    Client(db).enqueue_run("r-1", queue="email")
    tab = browse(rw, login=False)
    page = tab.page
    before = table_checksum(db)

    # A page needs a login: it sends the browser there, and back after.
    tab.goto("/runs?queue=email")
    assert tab.path() == "/login?" + urllib.parse.urlencode({"next": "/runs?queue=email"})
    assert page.request.get(rw.base + "/live").status == 403

    tab.expected += [r"^401 POST \S+/login$", r"^console error: .* status of 401 "]
    page.fill("input[name=name]", USER)
    page.fill("input[name=password]", "not the password")
    with page.expect_response(lambda r: r.request.method == "POST") as answer:
        page.click("form.login button[type=submit]")
    assert answer.value.status == 401
    expect(page.get_by_test_id("login-failed")).to_have_text("Wrong name or password.")
    tab.goto("/runs")
    assert tab.path().startswith("/login?")
    assert table_checksum(db) == before

    tab.login(next_path="/runs?queue=email")
    assert tab.run_ids() == _ids(db, "queue = 'email'") == ["r-1"]
    with page.expect_navigation():
        page.get_by_role("button", name="Log out").click()
    assert tab.path() == "/login"
    expect(page.locator("header .user")).to_have_count(0)
    tab.goto("/runs")
    assert tab.path().startswith("/login?")
    assert page.request.get(rw.base + "/live").status == 403
    assert table_checksum(db) == before


# -- live pages ------------------------------------------------------------------------------
def _following_live(tab: Tab) -> Page:
    """The tab's page once it follows the event stream, its document marked
    to tell later that the page was never reloaded."""
    tab.live()
    tab.page.evaluate("window.__notReloaded = 'yes'")
    return tab.page


def _still_same_document(page: Page) -> None:
    assert page.evaluate("window.__notReloaded") == "yes"
    assert page.evaluate("performance.getEntriesByType('navigation').length") == 1
    assert int(page.evaluate("document.body.dataset.refreshes || '0'")) >= 1


def test_the_runs_page_shows_new_and_ended_runs_without_a_reload(
    db: psycopg.Connection, rw: Dashboard, browse: Callable[..., Tab]
) -> None:
    tab = browse(rw, next_path="/runs?queue=live")
    page = _following_live(tab)
    expect(page.get_by_test_id("no-runs")).to_be_visible()

    client = Client(db)
    client.enqueue_run("live-1", queue="live")
    row = page.locator('table[data-testid=runs] tr[data-run-id="live-1"]')
    expect(row.locator("span.status")).to_have_text("queued", timeout=WAIT_MS)
    assert _status(db, "live-1") == "queued"

    _finish(client, "live-1", "live")
    assert _status(db, "live-1") == "completed"
    expect(row.locator("span.status")).to_have_text("completed", timeout=WAIT_MS)
    assert tab.path() == "/runs?queue=live"
    _still_same_document(page)


def test_the_overview_shows_the_backlog_move_without_a_reload(
    db: psycopg.Connection, rw: Dashboard, browse: Callable[..., Tab]
) -> None:
    tab = browse(rw, next_path="/")
    page = _following_live(tab)

    client = Client(db)
    client.enqueue_runs([{"run_id": f"ov-{i}", "queue": "live-ov"} for i in range(3)])
    row = page.locator('table[data-testid=queues] tr[data-queue="live-ov"]')
    expect(row.locator("td[data-col=queued]")).to_have_text("3", timeout=WAIT_MS)

    for run_id in ("ov-0", "ov-1"):
        # Oldest first within one priority; ties by run_id are the claim's business.
        (attempt,) = client.claim_attempts("test-hand", ["live-ov"])
        assert attempt.run_id.startswith("ov-"), run_id
        client.complete_attempt(**attempt.fence, result={})
    assert _count(db, "SELECT count(*) FROM runrelay.runs WHERE status = 'completed'") == 2
    expect(row.locator("td[data-col=completed]")).to_have_text("2", timeout=WAIT_MS)
    expect(row.locator("td[data-col=queued]")).to_have_text("1", timeout=WAIT_MS)
    _assert_overview_matches(db, page)
    _still_same_document(page)
