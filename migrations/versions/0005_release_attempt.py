"""Release: release_attempt hands a live attempt back without consuming one
of the run's max_attempts (a worker's shutdown, a handler's snooze); attempts
gain the status released.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from runrelay._migrations import support

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


upgrade, downgrade = support.code_revision(revision, down_revision)
