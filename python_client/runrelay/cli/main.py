"""The entry point: parse, run the command, map what it raised to an exit code."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence

from .. import _logging
from .common import EXIT_UNREACHABLE, CommandError
from .loops import _StoppedBeforeStart
from .output import line
from .parser import build_parser


def _unreachable(exc: BaseException) -> str | None:
    """The one-line reason when `exc` means the database is unreachable or not
    a runrelay install; None for any other error."""
    import psycopg
    import psycopg_pool

    from ..errors import SchemaMissing

    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, SchemaMissing):
            return f"no runrelay schema: {seen} (run `runrelay migrate`)"
        if isinstance(seen, psycopg.OperationalError | psycopg_pool.PoolTimeout):
            first = str(seen).strip().splitlines()[0] if str(seen).strip() else type(seen).__name__
            return f"cannot connect to the database: {first}"
        seen = seen.__cause__ or seen.__context__
    return None


def _error_line(message: str) -> None:
    """A command's error on stderr, escaped as all its output is: an error
    quotes data (a run id, the database's message), which must not reach the
    terminal as control characters."""
    line(message, file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _logging.configure(args.log_level, args.log_format)
    name = " ".join(filter(None, (args.command, getattr(args, "action", None))))
    try:
        return int(args.func(args))
    except CommandError as exc:
        _error_line(f"runrelay {name}: {exc}")
        return exc.code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`runrelay runs list | head`): stop quietly, as
        # a command killed by SIGPIPE would, without a traceback at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except _StoppedBeforeStart:
        return 0
    except Exception as exc:
        reason = _unreachable(exc)
        if reason is None:
            raise
        _error_line(f"runrelay {name}: {reason}")
        return EXIT_UNREACHABLE
