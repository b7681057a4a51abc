"""The `runrelay` command's conventions: options anywhere, described defaults,
--version, and failures as one clear line with a distinct exit status."""

from __future__ import annotations

import argparse
import importlib
import inspect
import os
import subprocess
import sys
from importlib.metadata import version

import pytest

from conftest import REPO
from runrelay.cli import EXIT_UNREACHABLE, EXIT_USAGE, build_parser

COMMANDS = [
    "migrate", "downgrade", "status", "processes", "worker", "relay", "maintain", "exporter",
    "dashboard", "demo", "runs", "ledger", "queues", "schedules",
]  # fmt: skip
# The actions of each command group.
ACTIONS = {
    "runs": ["list", "show", "enqueue", "cancel", "signal", "retry", "purge"],
    "ledger": ["blocked", "show", "requeue", "skip"],
    "queues": ["list", "pause", "resume"],
    "schedules": ["list", "set", "delete"],
}
NOWHERE = "postgresql://runrelay@127.0.0.1:1/nothing?connect_timeout=2"
WEBHOOK = "https://hook:pa55w0rd@example.com/hooks?token=s3cr3t"
NO_DB = ("--database-url", NOWHERE)


def _cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    return subprocess.run(
        [sys.executable, "-m", "runrelay.cli", *args],
        env={**environ, **env},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def test_every_option_is_described_and_shows_its_default() -> None:
    parser = build_parser()
    groups = _subparsers(parser)
    assert sorted(groups) == sorted(COMMANDS)
    assert {g: sorted(_subparsers(groups[g])) for g in ACTIONS} == {
        g: sorted(a) for g, a in ACTIONS.items()
    }
    commands = dict(groups)
    for group in ACTIONS:
        commands.update({f"{group} {a}": p for a, p in _subparsers(groups[group]).items()})
    for name, sub in commands.items():
        text = sub.format_help()
        for action in sub._actions:
            if not action.option_strings or action.dest == "help":
                continue
            assert action.help, f"{name} {action.option_strings[0]} has no description"
        flat = " ".join(text.split())
        for action in sub._actions:
            default = action.default
            if any(default is v for v in (None, False, True, argparse.SUPPRESS)):
                continue
            if action.option_strings:
                assert f"(default: {default})" in flat or "default:" in (action.help or ""), (
                    f"{name} {action.option_strings[0]}: default {default!r} not shown"
                )


@pytest.mark.parametrize(
    ("argv", "loop"),
    [
        (["worker", "json:loads"], "runrelay.worker:Worker"),
        (["relay", "--jsonl", "events.jsonl"], "runrelay.relay:Relay"),
        (["maintain"], "runrelay.maintenance:Maintenance"),
    ],
    ids=lambda v: v[0] if isinstance(v, list) else None,
)
def test_a_loop_commands_defaults_are_the_loops_own(argv: list[str], loop: str) -> None:
    """The parser writes the loops' defaults out (so that a command's start
    does not import the loop and what it imports); each option named like a
    parameter of the loop defaults to that parameter's default."""
    module, name = loop.split(":")
    params = inspect.signature(getattr(importlib.import_module(module), name)).parameters
    parsed = vars(build_parser().parse_args(argv))
    shared = {k for k, p in params.items() if k in parsed and p.default is not p.empty}
    assert len(shared) >= 2, shared
    for key in shared:
        given, own = parsed[key], params[key].default
        if key == "lanes":
            given = tuple(given.split(","))
        assert given == own, f"{argv[0]} --{key.replace('_', '-')}: {given!r}, the loop's {own!r}"


def test_the_cli_imports_no_sink_exporter_or_dashboard_until_a_command_needs_it() -> None:
    """Every command's start pays for what the parser imports: the HTTP
    client, the exporter, the dashboard, the migrations and rich's tables
    load only in the commands that use them."""
    code = (
        "import sys, runrelay.cli.main\n"
        "heavy = ('httpx', 'httpcore', 'starlette', 'prometheus_client', 'alembic', 'rich')\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & set(heavy)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout


def test_common_options_work_before_and_after_the_command() -> None:
    parser = build_parser()
    after = parser.parse_args(["migrate", "--schema", "billing", "--log-format", "json"])
    before = parser.parse_args(["--schema", "billing", "--log-format", "json", "migrate"])
    assert (after.schema, after.log_format) == (before.schema, before.log_format)
    assert (after.schema, after.log_format) == ("billing", "json")
    # Given on neither side: the defaults; on one side: that value, not overwritten.
    plain = parser.parse_args(["status"])
    assert (plain.schema, plain.log_level) == ("runrelay", "INFO")
    mixed = parser.parse_args(["--schema", "a", "status", "--log-level", "debug"])
    assert (mixed.schema, mixed.log_level) == ("a", "DEBUG")


def test_version() -> None:
    out = _cli("--version")
    assert out.returncode == 0
    assert out.stdout.strip() == f"runrelay {version('runrelay')}"


@pytest.mark.parametrize(
    "args",
    [
        ["migrate"],
        ["status"],
        ["worker", "json:loads"],
        ["relay", "--jsonl", "/tmp/never-written.jsonl"],
        ["maintain", "--once"],
        ["downgrade", "base"],
        ["runs", "list"],
    ],
    ids=lambda a: a[0],
)
def test_an_unreachable_database_is_one_line_and_exit_3(args: list[str]) -> None:
    out = _cli(*args, "--database-url", NOWHERE)
    assert out.returncode == EXIT_UNREACHABLE, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    command = " ".join(a for a in args[:2] if a in ("runs", "list") or a == args[0])
    assert lines[0].startswith(f"runrelay {command}: cannot connect to the database")


@pytest.mark.parametrize(
    "args", [["status"], ["worker", "json:loads"], ["maintain", "--once"], ["runs", "show", "r"]]
)
def test_a_database_without_the_schema_is_one_line_and_exit_3(db_url: str, args: list[str]) -> None:
    out = _cli(*args, "--schema", "not_installed", DATABASE_URL=db_url)
    assert out.returncode == EXIT_UNREACHABLE, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "runrelay migrate" in lines[0], out.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["status"], "set DATABASE_URL or pass --database-url"),
        (["worker", "no_such_module:handle", "--database-url", NOWHERE], "cannot load"),
        (["worker", "json", "--database-url", NOWHERE], "expected module:attribute"),
        (["relay", "--database-url", NOWHERE], "pass exactly one of"),
        (["relay", "--jsonl", "a", "--sink", "json:loads", "--database-url", NOWHERE], "exactly"),
        (["maintain", "--prune-after", "soon", "--database-url", NOWHERE], "not a duration"),
        (["worker", "json:loads", "--concurrency", "0"], "must be at least 1"),
        (["relay", "--webhook", WEBHOOK, "--webhook-secret", "c2hvcnQ=", *NO_DB], "16 bytes"),
        (["relay", "--webhook", WEBHOOK, "--webhook-secret", "s3cr3t text", *NO_DB], "base64"),
        (["relay", "--webhook", WEBHOOK, "--webhook-deadline", "0", *NO_DB], "deadline"),
        (["relay", "--webhook", "ftp://u:pa55w0rd@example.com/?token=s3cr3t", *NO_DB], "http"),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(args: list[str], message: str) -> None:
    out = _cli(*args)
    assert out.returncode == EXIT_USAGE, out.stderr
    assert message in out.stderr
    assert "Traceback" not in out.stderr
    assert message in out.stderr.strip().splitlines()[-1], out.stderr
    for secret in ("pa55w0rd", "s3cr3t", "c2hvcnQ="):  # neither the URL's nor the signing secret
        assert secret not in out.stderr, out.stderr


def test_worker_is_fused_unless_no_fused() -> None:
    """`runrelay worker` writes each outcome and claims the next run in one
    settle_and_claim call; --no-fused keeps the two-call path."""
    parser = build_parser()
    assert parser.parse_args(["worker", "m:f"]).fused is True
    assert parser.parse_args(["worker", "m:f", "--no-fused"]).fused is False


@pytest.mark.parametrize(
    "args",
    [["worker", "json:loads"], ["relay", "--jsonl", "/tmp/never-written.jsonl"], ["maintain"]],
    ids=lambda a: a[0],
)
def test_sigterm_while_still_connecting_is_a_clean_stop(args: list[str]) -> None:
    """An orchestrator may stop a loop that is still opening its pool: that is
    a graceful stop (nothing was claimed), exit 0 and no traceback, not death
    by the signal. The database here accepts the connection and never
    answers, so the command is still connecting when SIGTERM comes."""
    import signal
    import socket
    import time

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        port = silent.getsockname()[1]
        url = f"postgresql://runrelay@127.0.0.1:{port}/nothing?connect_timeout=60"
        environ = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
        proc = subprocess.Popen(
            [sys.executable, "-m", "runrelay.cli", *args, "--database-url", url],
            env=environ,
            cwd=REPO,
            stderr=subprocess.PIPE,
            text=True,
        )
        # The command is connecting once the server sees the connection.
        silent.settimeout(60)
        conn, _ = silent.accept()
        with conn:
            time.sleep(0.2)
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "Traceback" not in err, err
