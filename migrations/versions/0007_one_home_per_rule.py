"""One home per rule: the runnable predicate, wait kinds, the lane upsert and
the ledger result type each defined once; attempts.outcome checked.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02
"""

from runrelay._migrations import support

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


upgrade, downgrade = support.code_revision(revision, down_revision)
