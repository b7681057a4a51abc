"""Scheduler SQL API: enqueue, claim, heartbeat, complete, fail, suspend, wake,
signal, cancel, detached runners, reaping.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from runrelay._migrations import support

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


upgrade, downgrade = support.code_revision(revision, down_revision)
