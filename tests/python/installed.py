"""runrelay as a user gets it: the wheel built from this tree, installed into
a fresh virtual environment outside the repository.

The wheel is built from a copy of the tracked files (so nothing untracked or
generated in the checkout can leak into it) and installed with its
dependencies from the package index; nothing of the development venv is
visible to it. Commands then run from an empty working directory, so nothing
can be found through the source tree either (no alembic.ini, no migrations/).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _run(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(args)} exited {done.returncode}\n{done.stdout[-4000:]}\n"
            f"{done.stderr[-4000:]}"
        )
    return done.stdout


def build_wheel(workdir: Path) -> Path:
    """The wheel of the tracked files of this checkout."""
    source = workdir / "source"
    tracked = _run(["git", "ls-files", "-z"], REPO).split("\0")
    for name in filter(None, tracked):
        src = REPO / name
        if src.is_file():
            dst = source / name
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    out = workdir / "dist"
    _run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(source)],
        workdir,
    )
    (wheel,) = out.glob("runrelay-*.whl")
    return wheel


def wheel_files(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as zf:
        return set(zf.namelist())


@dataclass
class Installed:
    """A venv holding only the wheel (and its extras) plus their dependencies."""

    wheel: Path
    venv: Path
    home: Path  # an empty working directory outside the repository

    @property
    def runrelay(self) -> str:
        return str(self.venv / "bin" / "runrelay")

    @property
    def python(self) -> str:
        return str(self.venv / "bin" / "python")

    def env(self, **extra: str) -> dict[str, str]:
        """The environment for its commands: no PYTHONPATH, no dev venv on PATH."""
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "VIRTUAL_ENV", "DATABASE_URL")
        }
        env["PATH"] = f"{self.venv / 'bin'}:/usr/bin:/bin"
        env.update(extra)
        return env


def install(wheel: Path, workdir: Path, extras: str = "embedded") -> Installed:
    venv = workdir / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], workdir)
    target = f"{wheel}[{extras}]" if extras else str(wheel)
    _run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", target], workdir)
    home = workdir / "home"
    home.mkdir()
    return Installed(wheel, venv, home)
