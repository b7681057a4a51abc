"""${message}

Revision ID: ${up_revision}
Revises: ${down_revision | comma,n}
Create Date: ${create_date}
"""

from runrelay.migrations import support

revision = "${up_revision}"
down_revision = ${f'"{down_revision}"' if down_revision else None}
branch_labels = None
depends_on = None


upgrade, downgrade = support.code_revision(revision, down_revision)
