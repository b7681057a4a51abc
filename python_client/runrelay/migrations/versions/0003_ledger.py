"""Run ledger SQL API: append, claim, ack and claim-next, renew, release, fail,
requeue, prune, next-due, stats views.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from runrelay.migrations import support

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    support.run_frozen(revision, "upgrade.sql")
    support.install_code(revision)


def downgrade() -> None:
    support.drop_code()
    support.run_frozen(revision, "downgrade.sql")
    support.install_code(down_revision)
