"""Foundation: schema, tables, indexes, roles and the internal clock.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from runrelay._migrations import support

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


upgrade, downgrade = support.code_revision(revision, down_revision, creates_roles=True)
