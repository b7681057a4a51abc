"""The client and the loops through PgBouncer in transaction mode.

Transaction pooling hands each transaction to any server connection, so
nothing may rely on session state: every runrelay call is one autocommit
statement (its locks, lock_timeout and search_path live and die inside it),
LISTEN goes to a direct connection, and statements are not prepared
(prepare_threshold=None) on PgBouncer < 1.21, which cannot keep prepared
statements across transactions.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from lifecycle import check_database
from runrelay import Client, LedgerKind
from runrelay.relay import Relay
from runrelay.worker import Job, Suspend, Worker


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def bouncer(db_url: str) -> Iterator[str]:
    """A PgBouncer in transaction mode in front of the test database, with
    fewer server connections than clients so that transactions multiplex."""
    binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
    parts = urlsplit(db_url)
    dbname = parts.path.lstrip("/")
    port = _free_port()
    folder = Path(tempfile.mkdtemp(prefix="runrelay-bouncer-"))
    (folder / "users.txt").write_text('"postgres" ""\n')
    (folder / "pgbouncer.ini").write_text(
        f"""[databases]
{dbname} = host={parts.hostname} port={parts.port} dbname={dbname} user=postgres

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {folder}/users.txt
pool_mode = transaction
default_pool_size = 4
max_client_conn = 200
ignore_startup_parameters = extra_float_digits
logfile = {folder}/pgbouncer.log
"""
    )
    command = [binary, str(folder / "pgbouncer.ini")]
    if os.geteuid() == 0:  # PgBouncer refuses to run as root
        entry = pwd.getpwnam("postgres")
        os.chown(folder, entry.pw_uid, entry.pw_gid)
        for child in folder.iterdir():
            os.chown(child, entry.pw_uid, entry.pw_gid)
        command[1:1] = ["-u", "postgres"]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"postgresql://postgres@127.0.0.1:{port}/{dbname}"
    deadline = time.monotonic() + 15
    while True:
        try:
            with psycopg.connect(url, autocommit=True, prepare_threshold=None) as c:
                c.execute("SELECT 1")
            break
        except psycopg.OperationalError:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise
            time.sleep(0.1)
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def pooled(bouncer: str, db: psycopg.Connection) -> Iterator[Client]:
    pool = ConnectionPool(
        bouncer, min_size=2, max_size=12,
        kwargs={"autocommit": True, "prepare_threshold": None},
    )  # fmt: skip
    with pool:
        yield Client(pool, prepare_threshold=None)


def test_every_operation_works_through_transaction_pooling(
    db: psycopg.Connection, pooled: Client
) -> None:
    """Each call many times (past any prepare threshold), spread over server
    connections by the pooler."""
    c = pooled
    for i in range(12):
        run = f"r{i}"
        assert c.enqueue_run(run, payload={"i": i}).created
        assert c.enqueue_run(run, payload={"i": i}).created is False
        c.append_events(run, [{"type": "note", "delivery_key": f"note-{i}"}])
        [a] = c.claim_attempts("w", queues=["default"], call_id=uuid.uuid4())
        assert c.heartbeat(**a.fence).outcome == "ok"
        if i % 3 == 0:
            assert c.complete_attempt(**a.fence, result={"ok": i}) == "completed"
        elif i % 3 == 1:
            assert c.suspend_attempt(**a.fence, wait={"kind": "event", "name": "go"}) == "waiting"
            assert c.signal_run(run, "go") == "resumed"
            [b] = c.claim_attempts("w", queues=["default"])
            assert c.complete_attempts([b])[0].outcome == "completed"
        else:
            assert c.fail_attempt(**a.fence, error={"e": i}, retry_at=None) == "retry_scheduled"
            assert c.cancel_run(run) == "cancelled"
    assert c.reap_expired() == []
    delivered = 0
    while rows := c.claim_ledger("relay", batch=True, max_events=50):
        claimed = [r.event_id for r in rows if r.kind is LedgerKind.CLAIMED]
        assert c.renew_ledger_lease("relay", claimed)
        out = c.ack_ledger("relay", rows[0].run_id, claimed, claim_next=0, batch=True)
        delivered += sum(r.kind is LedgerKind.DELIVERED for r in out)
    assert delivered == db.execute("SELECT count(*) FROM runrelay.ledger").fetchone()[0]
    assert c.ledger_next_due_at() is None
    assert c.get_schema_version()
    statuses = check_database(db)
    assert statuses == {"completed": 8, "cancelled": 4}


def test_concurrent_clients_multiplexed_over_four_server_connections(
    db: psycopg.Connection, pooled: Client
) -> None:
    for i in range(300):
        pooled.enqueue_run(f"m{i}")
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            while claimed := pooled.claim_attempts(f"w{n}", max_runs=3):
                for a in claimed:
                    assert pooled.complete_attempt(**a.fence) == "completed"
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors[:2]
    assert check_database(db) == {"completed": 300}


def test_caller_transactions_pass_through_the_pooler(
    db: psycopg.Connection, bouncer: str, pooled: Client
) -> None:
    db.execute("CREATE TABLE IF NOT EXISTS public.orders (id text PRIMARY KEY)")
    db.execute("TRUNCATE public.orders")
    with psycopg.connect(bouncer, prepare_threshold=None) as conn:
        conn.execute("INSERT INTO public.orders VALUES ('kept')")
        pooled.enqueue_run("kept", conn=conn)
        conn.commit()
        conn.execute("INSERT INTO public.orders VALUES ('dropped')")
        pooled.enqueue_run("dropped", conn=conn)
        conn.rollback()
    assert db.execute("SELECT array_agg(id) FROM public.orders").fetchone() == (["kept"],)
    assert db.execute("SELECT array_agg(run_id) FROM runrelay.runs").fetchone() == (["kept"],)


def test_loops_through_the_pooler_listen_directly(
    db: psycopg.Connection, db_url: str, pooled: Client
) -> None:
    for i in range(30):
        pooled.enqueue_run(f"l{i}", payload={"sleep": i % 5 == 0})

    def handler(job: Job) -> dict[str, bool]:
        if job.payload["sleep"] and job.resume is None:
            raise Suspend.sleep(0.1)
        return {"done": True}

    seen: list[str] = []
    worker = Worker(pooled, handler, concurrency=4, poll_interval=0.05, listen_dsn=db_url)
    relay = Relay(
        pooled,
        lambda lane, events: seen.extend(e.delivery_key for e in events),
        max_sleep=0.05,
        listen_dsn=db_url,
    )
    worker.run(until_idle=1.0)
    relay.run(until_idle=0.5)
    assert check_database(db) == {"completed": 30}
    deliverable = db.execute(
        "SELECT count(*) FROM runrelay.ledger WHERE NOT acked_locally"
    ).fetchone()
    assert len(seen) == len(set(seen)) == deliverable[0]


def test_prepared_statements_break_on_this_pooler_without_the_setting(bouncer: str) -> None:
    """Why the docs say prepare_threshold=None here: a statement prepared on one
    server connection is missing on the next (PgBouncer < 1.21)."""
    version = subprocess.run(
        [shutil.which("pgbouncer") or "/usr/sbin/pgbouncer", "--version"],
        capture_output=True, text=True, check=True,
    ).stdout.split()[1]  # fmt: skip
    major, minor = (int(x) for x in version.split(".")[:2])
    pool = ConnectionPool(
        bouncer, min_size=4, max_size=4, kwargs={"autocommit": True, "prepare_threshold": 0}
    )
    with pool:
        client = Client(pool, prepare_threshold=0)
        failures = 0
        for _ in range(40):
            try:
                client.get_schema_version()
            except psycopg.Error:
                failures += 1
    if (major, minor) < (1, 21):
        assert failures > 0
    else:
        assert failures == 0
