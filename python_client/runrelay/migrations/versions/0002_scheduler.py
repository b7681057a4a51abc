"""Scheduler SQL API: enqueue, claim, heartbeat, complete, fail, suspend, wake,
signal, cancel, detached runners, reaping.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from runrelay.migrations import support

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    support.run_frozen(revision, "upgrade.sql")
    support.install_code(revision)


def downgrade() -> None:
    support.drop_code()
    support.run_frozen(revision, "downgrade.sql")
    support.install_code(down_revision)
