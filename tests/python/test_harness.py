"""The throwaway-cluster harness that `make test`, `make demo` and `make bench` use."""

from __future__ import annotations

import os

import psycopg
import pytest

from runrelay import _pgcluster


def _alive(pid: int) -> bool:
    """True while `pid` runs; a zombie (this sandbox's init may not reap) is not alive."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("flavor", ["system", "embedded"])
def test_cluster_starts_serves_and_leaves_nothing_behind(flavor: str) -> None:
    c = _pgcluster.start_cluster(flavor)
    try:
        with psycopg.connect(c.url(), autocommit=True) as conn:
            version = conn.execute("SHOW server_version_num").fetchone()
            assert version is not None and int(version[0]) // 10000 == c.version
            owner = conn.execute("SELECT current_setting('data_directory')").fetchone()
            assert owner == (str(c.datadir),)
        pid = int((c.datadir / "postmaster.pid").read_text().split()[0])
    finally:
        c.destroy()
    assert not c.root.exists()
    assert not _alive(pid)


def test_server_runs_unprivileged_when_we_are_root() -> None:
    c = _pgcluster.start_cluster("system")
    try:
        pid = int((c.datadir / "postmaster.pid").read_text().split()[0])
        uid = os.stat(f"/proc/{pid}").st_uid
        assert uid != 0 or os.geteuid() != 0
    finally:
        c.destroy()
