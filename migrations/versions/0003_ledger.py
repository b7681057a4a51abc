"""Run ledger SQL API: append, claim, ack and claim-next, renew, release, fail,
requeue, prune, next-due, stats views.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from runrelay._migrations import support

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


upgrade, downgrade = support.code_revision(revision, down_revision)
