"""Engine correctness: one lane lock order for every multi-run call, exact
replays (idempotency ids for signal_run and cancel_run), a caller's tighter
lock_timeout honoured, and a pushed detached-runner terminal that cannot wait
forever.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02
"""

from runrelay._migrations import support

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


upgrade, downgrade = support.code_revision(revision, down_revision)
