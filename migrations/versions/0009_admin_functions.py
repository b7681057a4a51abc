"""Admin functions: finding, inspecting and acting on runs and deliveries.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02
"""

from runrelay._migrations import support

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


upgrade, downgrade = support.code_revision(revision, down_revision)
