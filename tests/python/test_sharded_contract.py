"""The proxy's SQL contract: through PL/Proxy, runrelay answers as one install.

Every public function of a shard has its twin on the proxy (same name,
arguments with defaults, result, and EXECUTE grants per role), the stats
views have the same columns, the routing function agrees with the Python
client's, the proxy's PL/pgSQL passes plpgsql_check and sqlfluff, and bad
input through the walkers is rejected by the shard with its own SQLSTATE and
message, changing nothing anywhere.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from faults import checksum
from runrelay.sharding import ShardMap
from runrelay.sharding.install import ROLE_SUFFIXES
from sharded_harness import ShardedInstall, run_ids_on

pytestmark = pytest.mark.sharded

REPO = Path(__file__).resolve().parents[2]
SQL_DIR = REPO / "python_client" / "runrelay" / "sharding" / "sql"
ROLES = [f"runrelay_{s}" for s in ROLE_SUFFIXES]

FUNCTIONS = """
SELECT p.proname, pg_get_function_arguments(p.oid), pg_get_function_result(p.oid),
       array(SELECT r.rolname::text FROM pg_roles AS r
             WHERE r.rolname = ANY (%(roles)s)
               AND has_function_privilege(r.oid, p.oid, 'EXECUTE')
             ORDER BY 1)
FROM pg_proc AS p
WHERE p.pronamespace = 'runrelay'::regnamespace AND p.proname !~ '^_'
ORDER BY 1, 2
"""

VIEW_COLUMNS = """
SELECT c.relname, a.attnum, a.attname, format_type(a.atttypid, a.atttypmod)
FROM pg_class AS c
JOIN pg_attribute AS a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
WHERE c.relnamespace = 'runrelay'::regnamespace AND c.relname IN ('run_stats', 'ledger_stats')
ORDER BY 1, 2
"""


def _functions(conn: psycopg.Connection[Any]) -> dict[str, tuple[str, str, list[str]]]:
    rows = conn.execute(FUNCTIONS, {"roles": ROLES}).fetchall()
    out: dict[str, tuple[str, str, list[str]]] = {}
    for name, args, result, roles in rows:
        assert name not in out, f"{name} is overloaded"
        out[name] = (args, result, list(roles))
    return out


def test_every_shard_function_has_its_twin_on_the_proxy(sharded: ShardedInstall) -> None:
    shard = _functions(sharded.shard(0))
    proxy = _functions(sharded.connect())
    assert len(shard) > 40
    for name, (args, result, roles) in shard.items():
        assert name in proxy, f"the proxy has no {name}"
        p_args, p_result, p_roles = proxy[name]
        assert p_args == args, name
        assert p_result == result, name
        assert p_roles == roles, f"{name}: EXECUTE for {p_roles} on the proxy, {roles} on a shard"
    assert set(proxy) - set(shard) == {"shard_for", "shard_map"}
    # Both shards are alike, so either one stands for the contract.
    assert _functions(sharded.shard(1)) == shard
    for extra in ("shard_for", "shard_map"):
        assert proxy[extra][2] == sorted(ROLES), extra


def test_the_stats_views_have_the_shards_columns(sharded: ShardedInstall) -> None:
    shard = sharded.shard(0).execute(VIEW_COLUMNS).fetchall()
    proxy = sharded.connect().execute(VIEW_COLUMNS).fetchall()
    assert {r[0] for r in shard} == {"run_stats", "ledger_stats"}
    assert proxy == shard


def test_the_stats_views_sum_both_shards(sharded: ShardedInstall) -> None:
    client = sharded.client()
    for run_id in run_ids_on(sharded, 0, 2, "s") + run_ids_on(sharded, 1, 3, "s"):
        client.enqueue_run(run_id, queue="stats")
    rows = (
        sharded.connect()
        .execute("SELECT status, runs FROM runrelay.run_stats WHERE queue = 'stats'")
        .fetchall()
    )
    assert rows == [("queued", 5)]


def test_shard_map_lists_every_partition(sharded: ShardedInstall) -> None:
    rows = sharded.connect().execute("SELECT * FROM runrelay.shard_map()").fetchall()
    assert [r[0] for r in rows] == list(range(16))
    assert {r[1] for r in rows} == {0, 1}
    shard_map = sharded.shard_map()
    assert shard_map.shards == [0, 1]


RUN_IDS = st.one_of(
    st.text(min_size=1, max_size=40),
    st.builds(
        lambda a, tag, b: f"{a}{{{tag}}}{b}",
        st.text(max_size=8),
        st.text(max_size=8),
        st.text(max_size=8),
    ),
    st.builds(lambda tag: "{" + tag + "}", st.text(alphabet="{}é€😀ab", max_size=6)),
)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(run_ids=st.lists(RUN_IDS.filter(lambda s: "\x00" not in s), min_size=1, max_size=20))
def test_shard_for_agrees_with_the_python_client(
    sharded_install: ShardedInstall, run_ids: list[str]
) -> None:
    proxy = sharded_install.connect()
    shard_map = ShardMap.load(proxy)
    rows = proxy.execute(
        "SELECT r.run_id, runrelay.shard_for(r.run_id) FROM unnest(%s::text[]) AS r (run_id)",
        [run_ids],
    ).fetchall()
    for run_id, shard in rows:
        assert shard == shard_map.shard_for(run_id), run_id
    sharded_install.close()


def test_hash_tags_route_together(sharded: ShardedInstall) -> None:
    proxy = sharded.connect()
    rows = proxy.execute(
        "SELECT runrelay.shard_for(x) FROM unnest(ARRAY['a{k}', 'b{k}', '{k}', 'k']) AS x"
    ).fetchall()
    assert len({r[0] for r in rows}) == 1
    # An empty tag is no tag: the whole id routes.
    shard_map = sharded.shard_map()
    for run_id in ("{}", "x{}", "{}y", "é{}€"):
        row = proxy.execute("SELECT runrelay.shard_for(%s)", [run_id]).fetchone()
        assert row is not None and row[0] == shard_map.shard_for(run_id)


PLPGSQL_CHECK = """
SELECT p.oid::regprocedure::text, c.lineno, c.level, c.message, c.detail
FROM pg_proc AS p
JOIN pg_language AS l ON l.oid = p.prolang AND l.lanname = 'plpgsql'
LEFT JOIN pg_trigger AS t ON t.tgfoid = p.oid AND NOT t.tgisinternal
CROSS JOIN LATERAL plpgsql_check_function_tb(
    p.oid, relid => coalesce(t.tgrelid, 0),
    extra_warnings => true, performance_warnings => false, security_warnings => true
) AS c
WHERE p.pronamespace IN ('runrelay'::regnamespace, 'runrelay_proxy'::regnamespace,
                         'runrelay_config'::regnamespace)
ORDER BY 1, 2
"""


def test_plpgsql_check_is_clean_on_the_proxy(sharded: ShardedInstall) -> None:
    proxy = sharded.connect()
    proxy.execute("CREATE EXTENSION IF NOT EXISTS plpgsql_check")
    checked = proxy.execute(
        "SELECT count(*) FROM pg_proc AS p JOIN pg_language AS l ON l.oid = p.prolang"
        " WHERE l.lanname = 'plpgsql' AND p.pronamespace = 'runrelay'::regnamespace"
    ).fetchone()
    assert checked is not None and checked[0] >= 20
    findings = proxy.execute(PLPGSQL_CHECK).fetchall()
    assert findings == [], "\n".join(map(str, findings))


def test_the_proxy_sql_is_sqlfluff_clean() -> None:
    """As scripts/test_suite.sh lints it: the files are templates, and their
    .sqlfluff gives the placeholders stand-ins that parse like the real ones."""
    assert len(list(SQL_DIR.glob("*.sql"))) >= 5
    sqlfluff = Path(sys.executable).parent / "sqlfluff"
    done = subprocess.run(
        [
            str(sqlfluff),
            "lint",
            "--templater",
            "placeholder",
            "--disable-progress-bar",
            str(SQL_DIR.relative_to(REPO)),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "unparsable" not in done.stdout


# Bad input through the walkers: the shard answers with its own error, the
# proxy passes on its SQLSTATE and message, and no shard changes.
BAD_CALLS = {
    "claim_attempts max_runs 0": "SELECT * FROM runrelay.claim_attempts('w', ARRAY['q'], 0)",
    "claim_attempts max_runs NULL": "SELECT * FROM runrelay.claim_attempts('w', ARRAY['q'], NULL)",
    "claim_ledger lane ''": "SELECT * FROM runrelay.claim_ledger('r', '')",
    "settle_and_claim items an object": (
        "SELECT * FROM runrelay.settle_and_claim('{\"a\": 1}'::jsonb, 'w', ARRAY['q'])"
    ),
    "settle_and_claim items a string": (
        "SELECT * FROM runrelay.settle_and_claim('\"x\"'::jsonb, 'w', ARRAY['q'])"
    ),
    "enqueue_runs items an object": "SELECT * FROM runrelay.enqueue_runs('{\"a\": 1}'::jsonb)",
    "enqueue_runs items NULL": "SELECT * FROM runrelay.enqueue_runs(NULL)",
    "fail_ledger event_ids NULL": (
        "SELECT * FROM runrelay.fail_ledger('r', NULL, '{\"m\": 1}'::jsonb)"
    ),
}


def _error(conn: psycopg.Connection[Any], query: str) -> psycopg.Error:
    with pytest.raises(psycopg.Error) as caught:
        conn.execute(query)
    return caught.value


def _state(sharded: ShardedInstall) -> list[str]:
    return [checksum(sharded.shard(i)) for i in range(2)]


def _seed(sharded: ShardedInstall) -> Callable[[], list[str]]:
    """Work on both shards (queued runs, a claimed one, ledger events), so
    that a call that wrongly changed something would show."""
    client = sharded.client()
    for run_id in run_ids_on(sharded, 0, 2, "bad") + run_ids_on(sharded, 1, 2, "bad"):
        client.enqueue_run(run_id, queue="q")
    client.claim_attempts("w", ["q"], max_runs=2)
    return lambda: _state(sharded)


@pytest.mark.parametrize("label", sorted(BAD_CALLS))
def test_bad_input_through_a_walker_is_the_shards_error(
    sharded: ShardedInstall, label: str
) -> None:
    state = _seed(sharded)
    before = state()
    query = BAD_CALLS[label]
    on_shard = _error(sharded.shard(0), query)
    through = _error(sharded.connect(), query)
    assert on_shard.sqlstate is not None and on_shard.sqlstate.startswith("22"), on_shard
    assert through.sqlstate == on_shard.sqlstate, (str(through), str(on_shard))
    assert on_shard.diag.message_primary is not None
    assert through.diag.message_primary is not None
    assert on_shard.diag.message_primary in through.diag.message_primary
    assert state() == before


def test_event_ids_a_shard_accepts_are_answered_as_the_shard_does(
    sharded: ShardedInstall,
) -> None:
    """An event id of shard 5 (none is configured) goes to shard 0, which
    answers for it as for any id it does not hold; an empty id list is
    answered as a shard answers it. Nothing changes."""
    state = _seed(sharded)
    before = state()
    stray = (5 << 48) + 1
    query = f"SELECT * FROM runrelay.renew_ledger_lease('r', ARRAY[{stray}]::bigint[], 30)"
    on_shard = sharded.shard(0).execute(query).fetchall()
    through = sharded.connect().execute(query).fetchall()
    assert through == on_shard
    empty = "SELECT * FROM runrelay.fail_ledger('r', '{}'::bigint[], '{\"m\": 1}'::jsonb)"
    assert sharded.connect().execute(empty).fetchall() == sharded.shard(0).execute(empty).fetchall()
    mixed = f"SELECT * FROM runrelay.release_ledger('r', ARRAY[{stray}, 1]::bigint[])"
    assert sharded.connect().execute(mixed).fetchall() == sharded.shard(0).execute(mixed).fetchall()
    assert state() == before


def test_batch_answers_come_in_a_shards_order(sharded: ShardedInstall) -> None:
    """complete_attempts answers in run_id COLLATE "C" order (a shard's lock
    order) and enqueue_runs in item order, whichever shards the items are on."""
    ids = run_ids_on(sharded, 0, 3, "o") + run_ids_on(sharded, 1, 3, "o")
    mixed = [ids[0], ids[3], ids[1], ids[4], ids[2], ids[5]]
    client = sharded.client()
    enqueued = client.enqueue_runs([{"run_id": r, "queue": "oq"} for r in mixed])
    assert [e.run_id for e in enqueued] == mixed
    claimed = client.claim_attempts("w", ["oq"], max_runs=6)
    assert len(claimed) == 6
    done = client.complete_attempts(claimed)
    assert [d.run_id for d in done] == sorted(mixed, key=lambda r: r.encode())
    assert {d.outcome for d in done} == {"completed"}
