"""Worker path: set-based batch claims and completions, single-row lifecycle
events, the wake check as one index probe, attempts.claim_position for exact
claim replays.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from runrelay._migrations import support

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


upgrade, downgrade = support.code_revision(revision, down_revision)
