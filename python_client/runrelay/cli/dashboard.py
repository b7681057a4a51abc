"""`runrelay dashboard`: the web dashboard, with the role checks it makes
before it serves."""

from __future__ import annotations

import argparse
import logging
import os

from .common import EXIT_FAILED, EXIT_USAGE, CommandError, _require_url

log = logging.getLogger("runrelay.cli")


def cmd_dashboard(args: argparse.Namespace) -> int:
    """Serve the web dashboard until SIGINT/SIGTERM (docs/dashboard.md)."""
    try:
        from .. import dashboard
    except ImportError as exc:
        if (exc.name or "").split(".")[0] not in ("starlette", "jinja2", "uvicorn", "markupsafe"):
            raise
        raise CommandError(
            "needs the dashboard extra: pip install 'runrelay[dashboard]'", EXIT_FAILED
        ) from None
    url = _require_url(args)
    password = _dashboard_password(args)
    if args.read_write and not password:
        raise CommandError(
            "--read-write needs a password: set RUNRELAY_DASHBOARD_PASSWORD or pass "
            "--password-file (actions are taken only for a logged-in session)",
            EXIT_USAGE,
        )
    _check_roles(url, args.schema, args.read_write)
    secret = os.environ.get("RUNRELAY_DASHBOARD_SECRET")
    settings = dashboard.DashboardSettings(
        database_url=url,
        schema=args.schema,
        read_write=args.read_write,
        password=password,
        secret=secret.encode() if secret else None,
        page_size=args.page_size,
        allowed_hosts=tuple(args.allowed_host or ()),
        trusted_proxies=tuple(args.trusted_proxy or ()),
    )
    if password is None and args.host not in ("127.0.0.1", "::1", "localhost"):
        log.warning(
            "the dashboard listens on %s with no password: anyone who reaches it sees every "
            "run's payload and error (set RUNRELAY_DASHBOARD_PASSWORD)",
            args.host,
        )
    try:
        dashboard.serve(settings, host=args.host, port=args.port)
    except OSError as exc:
        raise CommandError(
            f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}"
        ) from None
    return 0


def _dashboard_password(args: argparse.Namespace) -> str | None:
    """--password-file's first line, else $RUNRELAY_DASHBOARD_PASSWORD (never
    an argument: the process list would show it)."""
    if args.password_file:
        try:
            with open(args.password_file, encoding="utf-8") as f:
                password = f.readline().rstrip("\r\n")
        except OSError as exc:
            raise CommandError(
                f"cannot read {args.password_file}: {exc.strerror}", EXIT_USAGE
            ) from None
        if not password:
            raise CommandError(f"{args.password_file} holds no password", EXIT_USAGE)
        return password
    return os.environ.get("RUNRELAY_DASHBOARD_PASSWORD") or None


def _check_roles(url: str, schema: str, read_write: bool) -> None:
    """Refuse to start as a role that may not call the admin functions, in one
    line; warn when a read-write dashboard's role may not cancel or signal
    (producer functions). A database that is away is only a warning: the
    pages say so until it is back."""
    import psycopg

    from ..client import Client
    from ..errors import PermissionDenied

    try:
        with Client(url, schema=schema) as c:
            c.list_paused_queues()
            if read_write:
                with c.connection() as conn:
                    row = conn.execute(
                        "SELECT pg_has_role(current_user, %s, 'USAGE')", (f"{schema}_producer",)
                    ).fetchone()
                if row != (True,):
                    log.warning(
                        "the login is not a member of %s_producer: Cancel and Send a signal "
                        "(cancel_run, signal_run) will be refused",
                        schema,
                    )
    except PermissionDenied:
        raise CommandError(
            f"the login needs {schema}_admin: the dashboard reads and acts through the "
            "admin functions",
            EXIT_FAILED,
        ) from None
    except psycopg.OperationalError as exc:
        from .._backoff import first_line

        log.warning("database unreachable for now (%s); serving anyway", first_line(exc))
