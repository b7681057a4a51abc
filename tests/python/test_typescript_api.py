"""The TypeScript client's generated files (clients/typescript/src/generated)
are what devtools.tsapi makes of the SQL API table, the Python client's
operation table and its error table: a signature, an outcome or an error
class changed on one side only fails here (run `make docs`)."""

from __future__ import annotations

import pytest
from devtools import tsapi


@pytest.mark.parametrize("path", sorted(tsapi.files()), ids=lambda p: p.name)
def test_generated_typescript_is_current(path) -> None:
    assert path.read_text(encoding="utf-8") == tsapi.files()[path], (
        f"{path} is stale: run make docs"
    )


def test_every_outcome_enum_and_result_row_is_typed() -> None:
    text = tsapi.sql_api_ts()
    for name in ("CancelOutcome", "SettleOutcome", "LedgerKind", "ClaimedAttempt", "LedgerEvent"):
        assert f"export type {name} =" in text or f"export interface {name} {{" in text
    assert '"fence_lost"' in text
    assert "readonly lag_ms?: number | null;" in text
