"""The built wheel, installed into a fresh venv outside the repository, does
everything the README promises a user: migrate, run the demo (on a given
database and on the embedded default), report status, downgrade."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import zipfile

import httpx
import psycopg
import pytest

from conftest import create_database, drop_database
from installed import Installed, wheel_files

pytestmark = pytest.mark.package  # one leg of make test runs these (pyproject.toml)


def _runrelay(installed: Installed, *args: str, timeout: float = 300, **env: str) -> str:
    done = subprocess.run(
        [installed.runrelay, *args],
        cwd=installed.home,
        env=installed.env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, f"runrelay {args} exited {done.returncode}:\n{done.stderr}"
    return done.stdout


def test_the_wheel_ships_the_migrations_and_no_dev_tooling(installed: Installed) -> None:
    names = wheel_files(installed.wheel)
    for required in (
        "runrelay/py.typed",
        "runrelay/migrations/__init__.py",
        "runrelay/migrations/env.py",
        "runrelay/migrations/script.py.mako",
        "runrelay/migrations/versions/0001_foundation.py",
        "runrelay/dashboard/templates/base.html",
        "runrelay/dashboard/templates/overview.html",
        "runrelay/dashboard/static/dashboard.js",
        "runrelay/dashboard/static/dashboard.css",
    ):
        assert required in names
    # The license travels with the package it licenses.
    assert any(n.endswith(".dist-info/licenses/LICENSE") or n.endswith(".dist-info/LICENSE")
               for n in names), sorted(n for n in names if "dist-info" in n)  # fmt: skip
    frozen = "runrelay/migrations/frozen/"
    revisions = {n.split("/")[3] for n in names if n.startswith(frozen) and n.count("/") == 4}
    versions = {n for n in names if n.startswith("runrelay/migrations/versions/0")}
    assert len(revisions) == len(versions) >= 4
    assert f"{frozen}RELEASED" in names
    assert "runrelay/_migrations/codetree.py" in names
    for rev in revisions:
        assert f"{frozen}{rev}/code.patch" in names
    assert not any(n.startswith(("devtools/", "tests/", "bench/", "plpgsql/")) for n in names)
    # The package applies patches; writing them (devtools/codepatch.py) is not shipped.
    with zipfile.ZipFile(installed.wheel) as wheel:
        codetree = wheel.read("runrelay/_migrations/codetree.py").decode()
    assert "def apply(" in codetree
    assert "def diff(" not in codetree and "def normalise(" not in codetree


def test_the_installed_package_is_the_wheel_not_the_checkout(installed: Installed) -> None:
    where = subprocess.run(
        [installed.python, "-c", "import runrelay.migrations as m; print(m.__file__)"],
        cwd=installed.home,
        env=installed.env(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert where.startswith(str(installed.venv))
    assert _runrelay(installed, "--version").strip().startswith("runrelay ")


def test_migrate_demo_status_downgrade_from_the_wheel(installed: Installed) -> None:
    url = create_database("rr_wheel")
    try:
        # The README's form: global options after the command, URL from the environment.
        _runrelay(installed, "migrate", "--schema", "rr_wheel_b", DATABASE_URL=url)
        _runrelay(installed, "migrate", "--database-url", url)
        out = _runrelay(
            installed, "demo", "--runs", "150", "--workers", "2", "--relays", "1",
            "--database-url", url,
        )  # fmt: skip
        assert "every run ended as expected; 0 ordering violations, 0 lost events" in out
        status = json.loads(_runrelay(installed, "status", "--json", "--database-url", url))
        assert status
        for schema in ("runrelay", "rr_wheel_b"):
            _runrelay(installed, "downgrade", "base", "--schema", schema, "--database-url", url)
        with psycopg.connect(url) as conn:
            left = conn.execute(
                "SELECT nspname FROM pg_namespace WHERE nspname IN ('runrelay', 'rr_wheel_b')"
            ).fetchall()
            roles = conn.execute(
                "SELECT rolname FROM pg_roles WHERE rolname LIKE 'rr\\_wheel\\_b\\_%'"
            ).fetchall()
        assert left == [] and roles == []
    finally:
        drop_database("rr_wheel")


def test_the_demo_serves_its_dashboard_while_it_runs(installed: Installed) -> None:
    """The demo prints a dashboard address before its runs flow; with
    --keep-dashboard the dashboard stays up after the summary, shows the
    demo's queues, and SIGTERM ends the demo with exit 0."""
    url = create_database("rr_wheel_demo_board")
    proc = subprocess.Popen(
        [installed.runrelay, "demo", "--runs", "100", "--workers", "1", "--relays", "1",
         "--keep-dashboard", "--dashboard-port", "0", "--database-url", url],
        cwd=installed.home,
        env=installed.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if "dashboard still on" in line:
                break
        printed = "".join(lines)
        board = re.search(r"dashboard \(read-only\): (http://127\.0\.0\.1:\d+/)", printed)
        assert board is not None, printed
        assert printed.index(board.group(0)) < printed.index("runs enqueued"), printed
        assert "every run ended as expected" in printed, printed
        page = httpx.get(board.group(1), timeout=30)
        assert page.status_code == 200
        for queue in ("email", "billing", "reports"):  # the demo's queues
            assert f'data-queue="{queue}"' in page.text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        drop_database("rr_wheel_demo_board")


@pytest.mark.slow
def test_demo_on_the_embedded_default_from_the_wheel(installed: Installed) -> None:
    """No DATABASE_URL: the demo starts its own PostgreSQL (runrelay[embedded])."""
    out = _runrelay(installed, "demo", "--runs", "100", "--workers", "1", "--relays", "1")
    assert "embedded PostgreSQL" in out
    assert "every run ended as expected" in out


def test_the_installed_package_runs_without_ever_importing_opentelemetry(
    installed: Installed,
) -> None:
    """Tracing is an extra: a producer, a worker and a relay of the installed
    wheel run without importing OpenTelemetry, and asking for tracing where
    it is missing says what to install."""
    url = create_database("rr_wheel_otel")
    try:
        _runrelay(installed, "migrate", "--database-url", url)
        program = (
            "import sys\n"
            "from runrelay import Client\n"
            "from runrelay.relay import Relay\n"
            "from runrelay.sinks import JsonLinesSink, WebhookSink\n"
            "from runrelay.worker import AsyncWorker, Worker\n"
            "import runrelay.cli\n"
            f"client = Client({url!r})\n"
            "client.enqueue_run('wheel-1')\n"
            "Worker(client, lambda job: None).run(until_idle=0.1)\n"
            "Relay(client, lambda lane, events: None).run(until_idle=0.1)\n"
            "prefixes = ('opentelemetry', 'runrelay.tracing')\n"
            "print(sorted(m for m in sys.modules if m.startswith(prefixes)))\n"
            "sys.modules['opentelemetry'] = None  # as where the extra is not installed\n"
            "try:\n"
            f"    Client({url!r}, tracing=True)\n"
            "except ImportError as err:\n"
            "    print(err)\n"
        )
        done = subprocess.run(
            [installed.python, "-c", program],
            cwd=installed.home,
            env=installed.env(),
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        )
        loaded, message = done.stdout.strip().splitlines()
        assert loaded == "[]"
        assert message.startswith(
            "tracing needs opentelemetry-api: pip install 'runrelay[tracing]'"
        )
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT status FROM runrelay.runs").fetchall() == [("completed",)]
    finally:
        drop_database("rr_wheel_otel")
