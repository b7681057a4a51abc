"""Worker path: a fused settle-and-claim call, bulk enqueue, one completion routine.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02
"""

from runrelay._migrations import support

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


upgrade, downgrade = support.code_revision(revision, down_revision)
