"""Foundation: schema, tables, indexes, roles and the internal clock.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from runrelay.migrations import support

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    support.run_frozen(revision, "upgrade.sql")
    support.create_roles()
    support.install_code(revision)


def downgrade() -> None:
    support.drop_code()
    support.run_frozen(revision, "downgrade.sql")
    support.drop_roles()
