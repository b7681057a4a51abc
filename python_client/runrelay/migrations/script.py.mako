"""${message}

Revision ID: ${up_revision}
Revises: ${down_revision | comma,n}
Create Date: ${create_date}
"""

from runrelay.migrations import support

revision = ${repr(up_revision)}
down_revision = ${repr(down_revision)}
branch_labels = None
depends_on = None


def upgrade() -> None:
    support.run_frozen(revision, "upgrade.sql")
    support.install_code(revision)


def downgrade() -> None:
    support.drop_code()
    support.run_frozen(revision, "downgrade.sql")
    support.install_code(down_revision)
