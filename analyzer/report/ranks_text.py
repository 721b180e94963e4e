"""Plain-text section for multi-rank runs: time per rank, communication as transfer vs waiting, skew."""

from __future__ import annotations

from collections import Counter
from typing import Any, TextIO

from analyzer.report.formatting import fmt_ns, fmt_pct, shorten, write_table

TOP_STAGES = 8
TOP_EVENTS = 5


def render_ranks(summary: dict[str, Any], out: TextIO, top: int = TOP_EVENTS) -> None:
    """Write the ``"ranks"`` section of ``summary`` to ``out``; nothing for a single-rank run."""
    r = summary.get("ranks")
    if not r:
        return
    ranks = r["ranks"]
    per = r["per_rank"]
    out.write(f"\nRanks ({len(ranks)}): communication = transfer + waiting for a slower rank\n")
    rows = []
    for p in per:
        comm = p["comm_ns"]
        rows.append(
            [
                str(p["rank"]),
                fmt_ns(p["kernel_ns"]),
                fmt_pct(p.get("idle_fraction")),
                fmt_ns(comm),
                fmt_ns(p["comm_transfer_ns"]),
                fmt_ns(p["comm_wait_ns"]),
                fmt_pct(p["comm_wait_ns"] / comm if comm else None),
                f"{p['last_arrivals']:,}",
            ]
        )
    write_table(
        out, ["rank", "kernel time", "idle", "comm", "transfer", "waiting", "wait%", "arrived last"], rows
    )
    out.write("  idle: 1 - the rank's busy time / its GPUs' time over its own wall\n")
    out.write(f"  {r['matched_collectives']:,} collectives matched across ranks ({_method(r['matching'])})\n")
    _stage_table(per, out)
    _events(r, out, top)
    _slowest(r, out)
    for n in r.get("notes", []):
        out.write(f"  note: {n}\n")


def _method(m: str) -> str:
    return {
        "order": "same sequence on every rank: n-th with n-th",
        "name": "by name and order: the sequences differ",
        "none": "none could be matched",
    }.get(m, m)


def _stage_table(per: list[dict[str, Any]], out: TextIO) -> None:
    total: Counter[str] = Counter()
    for p in per:
        for s in p["stages"]:
            total[s["stage"]] += s["time_ns"]
    stages = [s for s, _ in sorted(total.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_STAGES]]
    if not stages:
        return
    out.write("\n  time by stage per rank\n")
    by_rank = [{s["stage"]: s["time_ns"] for s in p["stages"]} for p in per]
    rows = [[s, *[fmt_ns(b.get(s, 0)) for b in by_rank]] for s in stages]
    write_table(out, ["stage", *[f"rank {p['rank']}" for p in per]], rows, indent="    ")


def _events(r: dict[str, Any], out: TextIO, top: int) -> None:
    events = r.get("skew_events") or []
    if not events:
        return
    out.write("\n  longest waits for a slower rank\n")
    rows = []
    for e in events[:top]:
        waits = ", ".join(f"r{x['rank']} {fmt_ns(x['wait_ns'])}/{fmt_ns(x['dur_ns'])}" for x in e["ranks"])
        rows.append(
            [
                f"#{e['index']}",
                e["phase"],
                str(e["step"]),
                f"rank {e['last_rank']}",
                fmt_ns(e["skew_ns"]),
                waits,
                shorten(e["name"].split("(")[0], 50),
            ]
        )
    write_table(
        out, ["coll", "phase", "step", "last in", "skew", "wait/dur per rank", "kernel"], rows, indent="    "
    )


def _slowest(r: dict[str, Any], out: TextIO) -> None:
    steps = r.get("steps") or []
    if not steps:
        return
    out.write("\n  slowest rank per step (the one the others waited for)\n")
    by_phase: dict[str, list[dict[str, Any]]] = {}
    for s in steps:
        by_phase.setdefault(s["phase"], []).append(s)
    rows = []
    for phase, ss in by_phase.items():
        counts = Counter(s["slowest_rank"] for s in ss)
        who = ", ".join(
            f"rank {k} in {v}/{len(ss)}" for k, v in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        )
        waited = sum(s["others_wait_ns"] for s in ss)
        rows.append([phase, str(len(ss)), who, fmt_ns(waited)])
    write_table(out, ["phase", "steps", "slowest", "others waited"], rows, indent="    ")
