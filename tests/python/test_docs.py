"""The generated reference docs stay true: docs/errors.md equals what
runrelay.errors.ERRORS generates, docs/sql-api.md equals what the migrated
schema generates, and the SQL quick start in it runs as written."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import shutil
import subprocess
from pathlib import Path

import psycopg
import pytest
from devtools import docs as _docs

import runrelay
from runrelay import _operations, errors

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
STALE = "is stale: run `make docs` (python -m devtools.docs) and commit the result"


def test_errors_md_is_generated_from_the_errors_table() -> None:
    assert (DOCS / "errors.md").read_text(encoding="utf-8") == _docs.errors_markdown(), (
        f"docs/errors.md {STALE}"
    )


def test_every_exported_exception_is_in_the_errors_table() -> None:
    """ERRORS is the one list: no typed exception of the package is missing
    from it (and so from docs/errors.md), and every row says what it means."""
    exported = {
        obj
        for obj in vars(runrelay).values()
        if inspect.isclass(obj)
        and issubclass(obj, errors.RunrelayError)
        and obj is not errors.RunrelayError
    }
    assert exported == set(errors.ERRORS)
    text = _docs.errors_markdown()
    for cls in errors.ERRORS:
        assert cls.__doc__, cls
        assert f"| `{cls.__name__}` | `{cls.sqlstate}`" in text


def test_sql_api_md_is_generated_from_the_schema(db_url: str) -> None:
    with psycopg.connect(db_url) as conn:
        expected = _docs.sql_api_markdown(conn)
    assert (DOCS / "sql-api.md").read_text(encoding="utf-8") == expected, f"docs/sql-api.md {STALE}"


def test_sql_api_md_documents_exactly_the_public_functions(db_url: str) -> None:
    """Every function the client calls has a section with its comment; no
    private helper leaks in."""
    with psycopg.connect(db_url) as conn:
        text = _docs.sql_api_markdown(conn)
        comments = dict(
            conn.execute(
                "SELECT proname, obj_description(oid, 'pg_proc') FROM pg_proc"
                " WHERE pronamespace = 'runrelay'::regnamespace"
            ).fetchall()
        )
    headings = {
        line.removeprefix("### `").split("`")[0]
        for line in text.splitlines()
        if line.startswith("### `") and not line.endswith("(view)")
    }
    assert headings == set(_operations.OPERATIONS)
    for name in _operations.OPERATIONS:
        assert comments[name], f"{name} has no COMMENT ON FUNCTION"
        assert comments[name] in text
    assert "## Workers (`runrelay_worker`)" in text
    assert "### `run_stats` (view)" in text


def test_the_quick_start_runs_in_psql(db: psycopg.Connection, db_url: str) -> None:
    psql = shutil.which("psql")
    assert psql, "psql is needed to check the SQL quick start"
    done = subprocess.run(
        [psql, "-X", "-v", "ON_ERROR_STOP=1", "-d", db_url, "-f", "-"],
        input=_docs.QUICK_START,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "claimed run.queued run.started run.completed" in done.stdout
    status = db.execute("SELECT status FROM runrelay.runs WHERE run_id = 'order-42'").fetchone()
    assert status == ("completed",)
    delivered = db.execute(
        "SELECT type FROM runrelay.ledger WHERE run_id = 'order-42'"
        " AND delivered_at IS NOT NULL ORDER BY seq"
    ).fetchall()
    assert delivered == [("run.queued",), ("run.started",), ("run.completed",)]


def test_command_line_writes_and_checks(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATABASE_URL", db_url)
    assert _docs.main(["--docs", str(tmp_path), "--check"]) == 1  # nothing there yet
    assert _docs.main(["--docs", str(tmp_path)]) == 0
    with psycopg.connect(db_url) as conn:
        rendered = _docs.render(conn)
    assert {p.name: p.read_text(encoding="utf-8") for p in tmp_path.iterdir()} == rendered
    assert _docs.main(["--docs", str(tmp_path), "--check"]) == 0
    (tmp_path / "errors.md").write_text("edited by hand\n", encoding="utf-8")
    assert _docs.main(["--docs", str(tmp_path), "--check"]) == 1


def _python_blocks(markdown: str) -> list[str]:
    blocks, current = [], None
    for line in markdown.splitlines():
        if current is None and line.strip() == "```python":
            current = []
        elif current is not None and line.strip() == "```":
            blocks.append("\n".join(current))
            current = None
        elif current is not None:
            current.append(line)
    return blocks


def test_python_client_md_examples_match_the_client() -> None:
    """The examples in docs/python-client.md compile, import names runrelay
    exports, and call client methods that exist with keywords they accept."""
    blocks = _python_blocks((DOCS / "python-client.md").read_text(encoding="utf-8"))
    assert len(blocks) >= 3
    calls = 0
    for block in blocks:
        flags = ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
        tree = compile(block, "docs/python-client.md", "exec", flags=flags)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("runrelay"):
                module = importlib.import_module(node.module or "")
                for alias in node.names:
                    assert hasattr(module, alias.name), (node.module, alias.name)
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "client"
            ):
                for cls in (runrelay.Client, runrelay.AsyncClient):
                    method = getattr(cls, node.func.attr)
                    accepted = inspect.signature(method).parameters
                    for keyword in node.keywords:
                        assert keyword.arg is None or keyword.arg in accepted, (
                            node.func.attr,
                            keyword.arg,
                        )
                calls += 1
    assert calls >= 4


def test_the_docs_stand_alone_without_the_specification() -> None:
    """Users have the README, docs/ and the package, not the internal
    specification they were written from: none of them refers to it."""
    shipped = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    shipped += sorted((REPO / "python_client" / "runrelay").rglob("*.py"))
    shipped += sorted((REPO / "python_client" / "runrelay").rglob("*.html"))
    found = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for path in shipped
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\bSPEC\b|SPEC\.md", line)
    ]
    assert found == []
