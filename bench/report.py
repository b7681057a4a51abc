# ruff: noqa: RUF001, RUF002, RUF003  (en dashes in min–max ranges are intended)
"""The terminal table, ratios, targets, plots and docs/benchmarks.md.

Ratios are taken repetition by repetition (the cases are interleaved, so
repetition i of two systems ran minutes apart at most) and summarised as
median [min–max] over repetitions. Targets (bounds in targets()) are judged on medians.
The hand-written analysis lives in bench/notes.md and is included verbatim.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench import scale_out

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "benchmarks.md"
IMG = REPO / "docs" / "img"
NOTES = Path(__file__).resolve().parent / "notes.md"
# The analysis section of docs/benchmarks.md: bench/notes.md, between these.
NOTES_HEADING = "\n## Analysis and next steps\n"
REPRODUCE_HEADING = "\n## Reproduce\n"

Doc = dict[str, Any]


# Figures -----------------------------------------------------------------


def _case(doc: Doc, key: str) -> dict[str, Any] | None:
    case = doc.get("cases", {}).get(key)
    return case if case and "throughput" in case else None


def _fmt(value: float) -> str:
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def _spread(s: dict[str, Any]) -> str:
    return f"{_fmt(s['median'])} [{_fmt(s['min'])}–{_fmt(s['max'])}]"


def _ratio(doc: Doc, num: str, den: str) -> dict[str, Any] | None:
    a, b = _case(doc, num), _case(doc, den)
    if a is None or b is None:
        return None
    reps = [
        x / y for x, y in zip(a["throughput"]["reps"], b["throughput"]["reps"], strict=False) if y
    ]
    if not reps:
        return None
    return {"median": statistics.median(reps), "min": min(reps), "max": max(reps)}


def _backlog_p50(doc: Doc, op: str, size: int) -> dict[str, Any] | None:
    entry = doc.get("backlog", {}).get("by_size", {}).get(str(size))
    claims = ("claim_attempts", "settle_and_claim", "claim_ledger")
    group = op if op in claims else "ledger_next_due_at"
    if not entry or group not in entry:
        return None
    return entry[group]["latency_ms"].get(op, {}).get("p50")  # type: ignore[no-any-return]


def ratios(doc: Doc) -> list[tuple[str, str, str, dict[str, Any] | None]]:
    """(label, numerator, denominator, ratio) for every comparison the doc shows."""
    plan = doc["plan"]
    rows: list[tuple[str, str, str, dict[str, Any] | None]] = []
    for w in plan["workers"]:
        rows += [
            (
                f"single, {w} workers: runrelay / two-statement floor",
                f"runrelay.single.w{w}",
                f"floor.claim_ack.w{w}",
            ),
            (
                f"single, {w} workers: runrelay / fused floor",
                f"runrelay.single.w{w}",
                f"floor.fused.w{w}",
            ),
            (
                f"single, {w} workers: runrelay / Procrastinate",
                f"runrelay.single.w{w}",
                f"procrastinate.single.w{w}",
            ),
            (
                f"single, {w} workers: runrelay / PgQueuer batch 1",
                f"runrelay.single.w{w}",
                f"pgqueuer.single.w{w}",
            ),
            (
                f"batch 10, {w} workers: runrelay / floor batch 10",
                f"runrelay.batch10.w{w}",
                f"floor.batch10.w{w}",
            ),
            (
                f"batch 10, {w} workers: runrelay / PgQueuer batch 10",
                f"runrelay.batch10.w{w}",
                f"pgqueuer.batch10.w{w}",
            ),
        ]  # type: ignore[misc]
    for w in plan["enqueue_workers"]:
        rows += [
            (
                f"enqueue, {w} workers: runrelay / floor INSERT",
                f"runrelay.enqueue.w{w}",
                f"floor.insert.w{w}",
            ),
            (
                f"bulk enqueue of 100, {w} workers: runrelay enqueue_runs / floor INSERT of 100",
                f"runrelay.enqueue100.w{w}",
                f"floor.insert100.w{w}",
            ),
            (
                f"enqueue, {w} workers: runrelay enqueue_runs of 100 / enqueue_run",
                f"runrelay.enqueue100.w{w}",
                f"runrelay.enqueue.w{w}",
            ),
            (
                f"enqueue, {w} workers: runrelay / Procrastinate defer",
                f"runrelay.enqueue.w{w}",
                f"procrastinate.enqueue.w{w}",
            ),
            (
                f"enqueue, {w} workers: runrelay / PgQueuer enqueue",
                f"runrelay.enqueue.w{w}",
                f"pgqueuer.enqueue.w{w}",
            ),
        ]  # type: ignore[misc]
    for r in plan["relays"]:
        rows.append(
            (
                f"ledger, {r} relays: batch 100 / head-only",
                f"ledger.batch100.r{r}",
                f"ledger.head.r{r}",
            )
        )  # type: ignore[arg-type]
    rows += [
        (
            "default Worker path (fused), 1 job per call, 4 workers / Procrastinate single",
            "runrelay.fused.w4",
            "procrastinate.single.w4",
        ),
        (
            "default Worker path (fused), 1 job per call, 4 workers / two-statement floor",
            "runrelay.fused.w4",
            "floor.claim_ack.w4",
        ),
        (
            "batch 10 (fused), 4 workers / PgQueuer batch 10",
            "runrelay.fused_batch10.w4",
            "pgqueuer.batch10.w4",
        ),
        (
            "ledger, 1 relay: batch 100 / PgQ batches of 100",
            "ledger.batch100.r1",
            "pgq.batch100.r1",
        ),
        ("hot run: batch 100 / head-only", "ledger.hot_batch100.r1", "ledger.hot_head.r1"),
        (
            "floor: two-statement claim+ack / SELECT 1 (1 conn)",
            "floor.claim_ack.w1",
            "floor.select1.c1",
        ),
    ]  # type: ignore[list-item]
    return [(label, n, d, _ratio(doc, n, d)) for label, n, d in rows]  # type: ignore[misc]


# The throughput targets that are a ratio of two cases of one run: (target,
# runrelay's case, the case it is measured against, the lowest ratio that
# meets it, the peer whose absence leaves it unmeasured).
RATIO_TARGETS: list[tuple[str, str, str, float, str | None]] = [
    (
        "one job per call (settle_and_claim), 4 workers vs the two-statement floor",
        "runrelay.fused.w4",
        "floor.claim_ack.w4",
        0.8,
        None,
    ),
    (
        "the same vs Procrastinate single",
        "runrelay.fused.w4",
        "procrastinate.single.w4",
        1.2,
        "procrastinate",
    ),
    (
        "batch 10 (fused), 4 workers vs PgQueuer batch 10",
        "runrelay.fused_batch10.w4",
        "pgqueuer.batch10.w4",
        1.2,
        "pgqueuer",
    ),
    (
        "enqueue one at a time vs Procrastinate defer, 4 producers",
        "runrelay.enqueue.w4",
        "procrastinate.enqueue.w4",
        1.0,
        "procrastinate",
    ),
    (
        "bulk enqueue of 100 vs floor INSERT of 100, 4 producers",
        "runrelay.enqueue100.w4",
        "floor.insert100.w4",
        0.5,
        None,
    ),
    (
        "ledger batch 100, 1 relay, vs PgQ batches of 100",
        "ledger.batch100.r1",
        "pgq.batch100.r1",
        0.4,
        "pgq",
    ),
]


def targets(doc: Doc) -> list[dict[str, Any]]:
    """The performance targets: measured value, bound, verdict (met / missed / not measured)."""
    out: list[dict[str, Any]] = []
    skipped = doc.get("peers", {}).get("skipped", {})

    def add(
        name: str,
        value: dict[str, Any] | None,
        ok: Callable[[float], bool],
        bound: str,
        why: str = "",
    ) -> None:
        if value is None:
            out.append(
                {
                    "target": name,
                    "bound": bound,
                    "value": None,
                    "verdict": "not measured",
                    "why": why,
                }
            )
        else:
            verdict = "met" if ok(value["median"]) else "missed"
            out.append(
                {"target": name, "bound": bound, "value": value, "verdict": verdict, "why": ""}
            )

    for name, num, den, bound, peer in RATIO_TARGETS:
        add(
            name,
            _ratio(doc, num, den),
            lambda v, bound=bound: v >= bound,
            f"≥ {bound:.1f}×",
            skipped.get(peer, "") if peer else "",
        )
    four = _case(doc, "ledger.batch100.r4")
    add(
        "ledger batch 100, 4 relays",
        four["throughput"] if four else None,
        lambda v: v >= 40_000,
        "≥ 40 000 events/s",
        "4 relays not measured (quick mode)",
    )
    for r in doc["plan"]["relays"]:
        add(
            f"ledger batch 100 vs head-only, {r} relay(s)",
            _ratio(doc, f"ledger.batch100.r{r}", f"ledger.head.r{r}"),
            lambda v: v >= 10,
            "≥ 10×",
        )
    sizes = doc.get("backlog", {}).get("sizes", [])
    if len(sizes) >= 2:
        lo, hi = min(sizes), max(sizes)
        for op in ("claim_attempts", "settle_and_claim", "claim_ledger", "ledger_next_due_at"):
            a, b = _backlog_p50(doc, op, hi), _backlog_p50(doc, op, lo)
            value = None
            if a and b and b["median"]:
                value = {
                    "median": a["median"] / b["median"],
                    "min": a["min"] / b["max"],
                    "max": a["max"] / b["min"],
                }
            label = f"{op} p50 at {hi:,} pending vs {lo:,}"
            if op == "ledger_next_due_at":
                runs_hi, runs_lo = max(1, hi // 100), max(1, lo // 100)
                label = f"{op} p50 at {runs_hi:,} runs pending vs {runs_lo:,}"
            add(label, value, lambda v: v <= 1.3, "≤ 1.3×")
    return out


# Terminal ----------------------------------------------------------------


def _latency_cell(case: dict[str, Any]) -> str:
    parts = []
    for op, lat in case["latency_ms"].items():
        if lat["samples"]:
            parts.append(f"{op} {_fmt(lat['p50']['median'])}/{_fmt(lat['p99']['median'])}")
    return "; ".join(parts)


def _cpu_cell(case: dict[str, Any]) -> str:
    """Server / client CPU ms per unit (job, event, call), medians; a dash
    where a run did not measure it (results from before it was measured, a
    server on another machine)."""
    if "server_cpu_ms" not in case or "client_cpu_ms" not in case:
        return "—"
    return f"{case['server_cpu_ms']['median']:.3f} / {case['client_cpu_ms']['median']:.3f}"


CPU_HEADER = "server / client CPU per unit (ms)"


def print_table(doc: Doc, console: Console) -> None:
    table = Table(title="runrelay bench — median [min–max] of repetitions; latency p50/p99 ms")
    for col in ("case", "throughput", "unit", CPU_HEADER, "latency p50/p99 (ms)"):
        table.add_column(col, overflow="fold")
    for key, case in doc.get("cases", {}).items():
        if "throughput" not in case:
            table.add_row(key, "failed", "", "", case.get("error", ""))
            continue
        table.add_row(
            key, _spread(case["throughput"]), case["unit"], _cpu_cell(case), _latency_cell(case)
        )
    console.print(table)
    ratio_table = Table(title="ratios (per repetition, median [min–max])")
    ratio_table.add_column("comparison")
    ratio_table.add_column("ratio")
    for label, _n, _d, r in ratios(doc):
        if r is not None:
            ratio_table.add_row(label, _spread(r) + "×")
    console.print(ratio_table)
    target_table = Table(title="targets")
    for col in ("target", "bound", "measured", "verdict"):
        target_table.add_column(col)
    for t in targets(doc):
        value = _spread(t["value"]) if t["value"] else t["why"]
        style = {"met": "green", "missed": "red"}.get(t["verdict"], "yellow")
        target_table.add_row(t["target"], t["bound"], value, f"[{style}]{t['verdict']}")
    console.print(target_table)
    for name, why in doc.get("peers", {}).get("skipped", {}).items():
        console.print(f"[yellow]skipped {name}: {why}")
    rt = doc.get("round_trips", {})
    if rt:
        console.print(f"round trips: every client method is 1 per call: {rt['all_one']}")


# Plots -------------------------------------------------------------------


def plot(doc: Doc, folder: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    plan = doc["plan"]
    names: list[str] = []

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    panels = [
        (
            "one job per claim (claim + ack)",
            [
                ("floor: UPDATE…SKIP LOCKED + UPDATE", "floor.claim_ack"),
                ("floor: fused in one function", "floor.fused"),
                ("runrelay claim_attempts + complete_attempt", "runrelay.single"),
                ("runrelay settle_and_claim (Worker default)", "runrelay.fused"),
                ("Procrastinate fetch_job + finish_job", "procrastinate.single"),
                ("PgQueuer, batch 1", "pgqueuer.single"),
            ],
        ),
        (
            "10 jobs per claim",
            [
                ("floor: batch claim + ANY(ids) ack", "floor.batch10"),
                ("runrelay max_runs=10 + complete_attempts", "runrelay.batch10"),
                ("runrelay settle_and_claim of 10 (Worker default)", "runrelay.fused_batch10"),
                ("PgQueuer dequeue + log_job, batch 10", "pgqueuer.batch10"),
            ],
        ),
    ]
    for ax, (title, series) in zip(axes, panels, strict=True):
        for label, prefix in series:
            xs, ys, lo, hi = [], [], [], []
            for w in plan["workers"]:
                case = _case(doc, f"{prefix}.w{w}")
                if case:
                    t = case["throughput"]
                    xs.append(w)
                    ys.append(t["median"])
                    lo.append(t["median"] - t["min"])
                    hi.append(t["max"] - t["median"])
            if xs:
                ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, label=label)
        ax.set_title(title)
        ax.set_xlabel("workers (processes, one connection each; 2 CPU cores)")
        ax.set_ylabel("jobs/s (median, min–max)")
        ax.set_xticks(plan["workers"])
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("Throughput vs workers — synchronous_commit=on, fsync on")
    fig.tight_layout()
    fig.savefig(folder / "throughput_vs_workers.png", dpi=110)
    plt.close(fig)
    names.append("throughput_vs_workers.png")

    backlog = doc.get("backlog", {})
    sizes = backlog.get("sizes", [])
    if sizes:
        fig, ax = plt.subplots(figsize=(8, 4.2))
        for op, group in (
            ("claim_attempts", "claim_attempts"),
            ("settle_and_claim", "settle_and_claim"),
            ("claim_ledger", "claim_ledger"),
            ("ledger_next_due_at", "ledger_next_due_at"),
        ):
            for pct, style in (("p50", "-o"), ("p99", "--x")):
                xs, ys, lo, hi = [], [], [], []
                for size in sizes:
                    entry = backlog["by_size"].get(str(size), {}).get(group)
                    if not entry or op not in entry["latency_ms"]:
                        continue
                    s = entry["latency_ms"][op][pct]
                    xs.append(size)
                    ys.append(s["median"])
                    lo.append(s["median"] - s["min"])
                    hi.append(s["max"] - s["median"])
                if xs:
                    ax.errorbar(xs, ys, yerr=[lo, hi], fmt=style, capsize=3, label=f"{op} {pct}")
        ax.set_xscale("log")
        ax.set_xlabel("pending runs / events (ledger: 100 events per run)")
        ax.set_ylabel("latency per call, ms")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        ax.set_title("Latency vs backlog — one worker, serial calls")
        fig.tight_layout()
        fig.savefig(folder / "latency_vs_backlog.png", dpi=110)
        plt.close(fig)
        names.append("latency_vs_backlog.png")
    return names


# docs/benchmarks.md ------------------------------------------------------


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def markdown(doc: Doc, results_path: str, images: list[str]) -> str:
    plan, server, machine = doc["plan"], doc["server"], doc["machine"]
    load_start = tuple(round(x, 1) for x in machine["load_average_at_start"])
    load_end = tuple(round(x, 1) for x in machine.get("load_average_at_end", (0, 0, 0)))
    out: list[str] = []
    out.append("# Benchmarks\n")
    out.append(
        "<!-- Generated by `make bench` (bench/report.py); "
        "edit bench/notes.md, not this file. -->\n"
    )
    out.append(
        f"One run of `make bench` on {doc['date']} ({doc['elapsed_seconds']:.0f} s); its raw "
        f"results were written to `{results_path}`, which is not committed (`make bench` "
        f"writes a new one). Every figure is the median of {plan['reps']} repetitions with "
        "[min–max]; ratios are computed repetition by repetition (the cases are interleaved, "
        "so each pair ran close in time) and summarised the same way.\n"
    )
    out.append("## How it was measured\n")
    out.append(
        f"- **Machine**: {machine['cpus']} CPU cores, {machine['platform']}, Python "
        f"{machine['python']}; load average {load_start} at start, {load_end} at end. "
        "The machine is shared: other engineers run test suites on it concurrently, so absolute "
        "numbers drift between runs; compare the ratios.\n"
        f"- **Server**: PostgreSQL {server['server_version']}, started by the bench with default "
        f"durability: fsync={server['fsync']}, full_page_writes={server['full_page_writes']}, "
        f"synchronous_commit={server['synchronous_commit']} "
        f"(wal_sync_method={server['wal_sync_method']}, "
        f"shared_buffers={server['shared_buffers']}). Every system gets its own database on this "
        "one server.\n"
        "- **Workers**: separate processes, one autocommit connection each (psycopg 3, statements "
        "prepared after 5 executions), after 8 warm-up iterations; a window of "
        f"{plan['window']} s, or until the backlog is empty. With 2 cores, 4 and 8 workers share "
        "the CPUs with the server backends: scaling beyond 2 is bounded by the machine, not only "
        "by the systems.\n"
        "- **Backlogs** are loaded with `INSERT … SELECT generate_series` and ANALYZEd before "
        f"every repetition: {plan['backlog_single']:,} jobs for one-job claims, "
        f"{plan['backlog_batch']:,} for batched claims; ledger: "
        f"{plan['ledger_runs_head']} runs × 100 events (head-only), "
        f"{plan['ledger_runs_batch']} runs × 100 events (batch 100), one hot run of "
        f"{plan['hot_events']:,} events.\n"
        "- **runrelay** is called through `runrelay.Client` (one statement per call). Per job it "
        "also writes an attempt row and two lifecycle ledger events (run.started, run.completed) "
        "with its ledger lane — the floor writes none of that.\n"
        "- **Peers** run their own schema and the exact SQL their workers issue, taken from the "
        "installed libraries, through the same harness (same driver, processes, backlog, window): "
        "this compares database work per job, not the libraries' Python loops.\n"
    )
    versions = doc.get("peers", {}).get("versions", {})
    if versions:
        out.append(
            "- **Peer versions**: " + ", ".join(f"{k} {v}" for k, v in versions.items()) + ".\n"
        )
    for name, why in doc.get("peers", {}).get("skipped", {}).items():
        out.append(f"- **Skipped: {name}** — {why}.\n")

    out.append("\n## Results\n")
    rows = []
    for key, case in doc["cases"].items():
        if "throughput" not in case:
            rows.append([f"`{key}`", "failed", "", "", case.get("error", "")])
            continue
        rows.append(
            [
                f"`{key}`",
                _spread(case["throughput"]),
                case["unit"],
                _cpu_cell(case),
                _latency_cell(case),
            ]
        )
    headers = ["case", "throughput", "unit", CPU_HEADER, "latency p50/p99 per call (ms)"]
    out.append(_md_table(headers, rows) + "\n")
    out.append(
        "\nKeys: `floor.*` the floor; `*.w4` 4 workers, `*.c16` 16 connections, `*.r4` 4 relays. "
        "`single` = one job per claim; `batch10` = 10 jobs per claim and one ack of 10; "
        "`fused` / `fused_batch10` = the Worker's default path, one `settle_and_claim` per "
        "step that completes the runs held and claims the next 1 / 10; "
        "`ledger.head` = head-only delivery (ack + claim-next of 1), `ledger.batch100` = frozen "
        "batches of 100; `hot_*` = one run with all the events. "
        "Server CPU is what the workers' own backends used in the window (their "
        "commits' WAL flushes included, the server's background processes not), "
        "client CPU what the worker processes used, each divided by the jobs, "
        "events or calls done.\n"
    )

    out.append("\n## Ratios\n")
    rrows = [[label, _spread(r) + "×"] for label, _n, _d, r in ratios(doc) if r is not None]
    out.append(_md_table(["comparison", "ratio"], rrows) + "\n")

    out.append("\n## Where we stand against each target\n")
    trows = []
    for t in targets(doc):
        value = _spread(t["value"]) if t["value"] else f"— ({t['why']})"
        trows.append([t["target"], t["bound"], value, f"**{t['verdict']}**"])
    out.append(_md_table(["target", "bound", "measured", "verdict"], trows) + "\n")
    out.append("\nThe analysis of every missed target, with its profile, is below the plots.\n")

    for name in images:
        out.append(f"\n![{name[:-4].replace('_', ' ')}](img/{name})\n")

    backlog = doc.get("backlog", {})
    if backlog:
        out.append("\n## Backlog growth\n")
        brows = []
        for size in backlog["sizes"]:
            e = backlog["by_size"][str(size)]
            loads = e["load_seconds"]

            def cell(group: str, op: str, e: dict[str, Any] = e) -> str:
                lat = e[group]["latency_ms"].get(op)
                return (
                    f"{_fmt(lat['p50']['median'])} / {_fmt(lat['p99']['median'])}" if lat else "—"
                )

            brows.append(
                [
                    f"{size:,}",
                    cell("claim_attempts", "claim_attempts"),
                    cell("claim_attempts", "complete_attempt"),
                    cell("claim_ledger", "claim_ledger"),
                    cell("claim_ledger", "ack_ledger"),
                    f"{cell('ledger_next_due_at', 'ledger_next_due_at')} "
                    f"({e.get('runs_pending', 0):,} runs)",
                    f"{loads.get('runs', 0)} s / {loads.get('ledger', 0)} s",
                ]
            )
        out.append(
            f"One worker, {backlog['samples']} serial calls per repetition; p50 / p99 in ms.\n\n"
            + _md_table(
                [
                    "pending",
                    "claim_attempts",
                    "complete_attempt",
                    "claim_ledger",
                    "ack_ledger",
                    "ledger_next_due_at",
                    "load runs / ledger",
                ],
                brows,
            )
            + "\n"
        )
        out.append(
            "\nShared buffers per call of the busiest statements (pg_stat_statements, nested "
            "statements included), smallest vs largest backlog — the plan-shape evidence:\n"
        )
        lo, hi = str(min(backlog["sizes"])), str(max(backlog["sizes"]))
        for group in ("claim_attempts_statements", "claim_ledger_statements"):
            srows = []
            small = {s["query"]: s for s in backlog["by_size"][lo].get(group, [])}
            for s in backlog["by_size"][hi].get(group, [])[:8]:
                before = small.get(s["query"])
                srows.append(
                    [
                        "`" + s["query"][:90].replace("|", "\\|") + "`",
                        _fmt(before["buffers_per_call"]) if before else "—",
                        _fmt(s["buffers_per_call"]),
                        _fmt(before["mean_ms"]) if before else "—",
                        _fmt(s["mean_ms"]),
                    ]
                )
            out.append(
                f"\n{group.replace('_statements', '')}:\n\n"
                + _md_table(
                    [
                        "statement",
                        f"buffers @ {int(lo):,}",
                        f"buffers @ {int(hi):,}",
                        f"ms @ {int(lo):,}",
                        f"ms @ {int(hi):,}",
                    ],
                    srows,
                )
                + "\n"
            )

    prof = doc.get("profile", {})
    if prof:
        out.append("\n## Where runrelay's time goes (4 workers, pg_stat_statements, track = all)\n")
        for key, p in prof.items():
            prow = [
                [
                    "`" + s["query"][:100].replace("|", "\\|") + "`",
                    str(s["calls"]),
                    _fmt(s["mean_ms"]),
                    _fmt(s["buffers_per_call"]),
                ]
                for s in p["statements"][:10]
            ]
            out.append(
                f"\n`{key}` ({p['jobs']} jobs in the window):\n\n"
                + _md_table(["statement", "calls", "mean ms", "buffers/call"], prow)
                + "\n"
            )

    rt = doc.get("round_trips", {})
    if rt:
        out.append("\n## Round trips per operation\n")
        out.append(
            f"Counted in a libpq protocol trace (each Sync or simple Query is one round trip), "
            f"{rt['calls_per_method']} calls per method so the prepared path is covered too. "
            f"Every client method is exactly one round trip: **{rt['all_one']}**.\n\n"
        )
        out.append(
            _md_table(
                ["method", "round trips (max of calls)"],
                [[f"`{m}`", str(n)] for m, n in rt["max_by_method"].items()],
            )
            + "\n"
        )

    sharded = doc.get("scale_out")
    if sharded:
        out.append("\n## Scale-out through PL/Proxy\n")
        loads = [
            tuple(round(x, 1) for x in sharded["machine"].get(k, ()))
            for k in ("load_average_at_start", "load_average_at_end")
        ]
        out.append(
            "The sharded install (`bench.scale_out`, its own durable clusters: a proxy with one "
            f"shard and a proxy with two, all on this machine; {sharded['elapsed_seconds']:.0f} s, "
            f"load average {loads[0]} at start, {loads[1]} at end). Both shards share the same "
            f"{machine['cpus']} CPUs here, so the two-shard throughput is not a scale-out "
            "result; the server CPU per job is what carries over to shards on machines of "
            "their own, through the model in [scale-out.md](scale-out.md#what-it-costs).\n\n"
        )
        out.append(scale_out.markdown(sharded))

    out.append(NOTES_HEADING)
    if NOTES.exists():
        out.append(NOTES.read_text())
    out.append(
        REPRODUCE_HEADING + "\n```bash\n"
        "make bench        # full run, about 15 minutes, rewrites this file\n"
        "make bench-quick  # tiny sizes, a smoke test (part of make test)\n"
        "python -m bench.run --sizes 1000 100000 --reps 5 --out /tmp/bench\n```\n"
    )
    return "\n".join(out)


def write_docs(doc: Doc, results: Path) -> None:
    images = plot(doc, IMG)
    try:
        shown = str(results.resolve().relative_to(REPO))
    except ValueError:
        shown = str(results)
    DOC.write_text(markdown(doc, shown, images))


def splice_notes(text: str) -> str:
    """docs/benchmarks.md with its analysis replaced by bench/notes.md as it
    is now: the tables stay those of the run the document was made from."""
    start = text.index(NOTES_HEADING) + len(NOTES_HEADING)
    end = text.index(REPRODUCE_HEADING, start)
    return text[:start] + "\n" + NOTES.read_text() + "\n" + text[end:]


def main(argv: list[str] | None = None) -> int:
    """`python -m bench.report RESULTS.json`: regenerate the docs from a results
    file. `python -m bench.report --notes`: only bring docs/benchmarks.md's
    analysis up to date with bench/notes.md (raw results are not committed)."""
    import argparse
    import json

    parser = argparse.ArgumentParser(prog="python -m bench.report")
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("results", type=Path, nargs="?")
    group.add_argument("--notes", action="store_true", help="splice bench/notes.md only")
    args = parser.parse_args(argv)
    if args.notes:
        DOC.write_text(splice_notes(DOC.read_text()))
        return 0
    doc = json.loads(args.results.read_text())
    print_table(doc, Console())
    write_docs(doc, args.results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
