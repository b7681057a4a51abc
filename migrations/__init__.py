"""The Alembic home of runrelay: env.py, the revisions in versions/ and the
SQL each one freezes in frozen/<rev>/. It lives at the top of the checkout
and ships inside the package as ``runrelay.migrations`` (pyproject.toml maps
it), so ``alembic.ini``'s ``script_location = runrelay:migrations`` and
``runrelay migrate`` find it in a wheel as in a checkout.

The Python that runs the migrations lives in ``runrelay._migrations``
(type-checked with the rest of the package); this package keeps its public
names:

    from runrelay import migrations
    migrations.upgrade("postgresql://...", schema="runrelay")   # to head
    migrations.downgrade("postgresql://...", "base")           # remove everything
"""

from runrelay._migrations import config, downgrade, head, upgrade

__all__ = ["config", "downgrade", "head", "upgrade"]
