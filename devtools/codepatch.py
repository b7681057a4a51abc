"""Writing a revision's code.patch (make freeze): development tooling only.

The package reads patches (runrelay._migrations.codetree applies them); only a
checkout writes them, so this module is not in the wheel.

A patch carries no context lines: each hunk is the lines it removes and the
lines it adds, at their line numbers. The applier is strict all the same:
every removed line must be exactly what the file holds at that line, an
insertion lands after exactly the line its header names, and a released
revision's assembled tree must still have the sha256 that frozen/RELEASED
records. So context would prove nothing the checksum does not, and it cost
a third of the stored SQL.
"""

from __future__ import annotations

import difflib

from runrelay._migrations.codetree import Tree, install_order


def normalise(text: str) -> str:
    """A file as the tree holds it: trailing whitespace cut, one final newline."""
    return text.rstrip() + "\n"


def diff(old: Tree, new: Tree) -> str:
    """The code.patch that turns tree ``old`` into tree ``new``."""
    out: list[str] = []
    for path in install_order(set(old) | set(new)):
        a, b = old.get(path), new.get(path)
        if a == b:
            continue
        out.extend(
            difflib.unified_diff(
                (a or "").splitlines(keepends=True),
                (b or "").splitlines(keepends=True),
                fromfile="/dev/null" if a is None else f"a/{path}",
                tofile="/dev/null" if b is None else f"b/{path}",
                n=0,
            )
        )
    return "".join(out)
