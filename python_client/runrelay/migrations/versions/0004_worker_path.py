"""Worker path: set-based batch claims and completions, single-row lifecycle
events, the wake check as one index probe, attempts.claim_position for exact
claim replays.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from runrelay.migrations import support

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    support.run_frozen(revision, "upgrade.sql")
    support.install_code(revision)


def downgrade() -> None:
    support.drop_code()
    support.run_frozen(revision, "downgrade.sql")
    support.install_code(down_revision)
