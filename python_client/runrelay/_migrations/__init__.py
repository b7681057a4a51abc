"""Running the Alembic migrations that install runrelay. Their home (env.py,
versions/, frozen/) is the top-level migrations/ folder, shipped as the
package ``runrelay.migrations``, which re-exports these functions:

    from runrelay import migrations
    migrations.upgrade("postgresql://...", schema="runrelay")   # to head
    migrations.downgrade("postgresql://...", "base")           # remove everything

`runrelay migrate` and `runrelay downgrade` call these. They need no
alembic.ini and no source checkout: the script location is that package
(the package `runrelay.migrations`), and each revision executes the SQL frozen beside it
in `frozen/<rev>/`. See docs/migrations.md.
"""

from __future__ import annotations

import argparse

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory

from .codetree import alembic_home

# The folder itself, not `runrelay:migrations`: Alembic reads that as a
# resource folder of the package runrelay, which in an editable checkout is
# python_client/runrelay, not the top-level migrations/ the package maps.
SCRIPT_LOCATION = str(alembic_home())


def config(url: str, schema: str = "runrelay") -> Config:
    """An Alembic Config for one install: the database and the schema travel as
    `-x url=...` and `-x schema=...`, exactly as on the alembic command line."""
    cfg = Config()
    cfg.set_main_option("script_location", SCRIPT_LOCATION)
    cfg.cmd_opts = argparse.Namespace(x=[f"url={url}", f"schema={schema}"])
    return cfg


def upgrade(url: str, schema: str = "runrelay", revision: str = "head") -> None:
    """Install or upgrade the schema to `revision` (default: the newest)."""
    command.upgrade(config(url, schema), revision)


def downgrade(url: str, revision: str, schema: str = "runrelay") -> None:
    """Downgrade to `revision`; "base" removes the schema and its roles."""
    command.downgrade(config(url, schema), revision)


def head() -> str:
    """The newest revision this package ships."""
    revision = ScriptDirectory.from_config(config("postgresql://unused")).get_current_head()
    assert revision is not None
    return revision
