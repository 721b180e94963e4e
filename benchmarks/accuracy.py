"""Measure the analyzer on the zoo: ``check`` on every ``fixtures/zoo/<case>``, one table row each.

    python benchmarks/accuracy.py            # print the table, rewrite its section of docs/accuracy.md
    python benchmarks/accuracy.py --pin      # also write tests/data/zoo_accuracy.json (the pinned floors)
    python benchmarks/accuracy.py --keep-steps --no-docs   # the annotated path, printed only
    python benchmarks/accuracy.py --engines  # engine traces without their annotations (docs table too)
    python benchmarks/accuracy.py --flops    # FLOPs against PyTorch's own counter, every zoo case
                                             # (needs torch + transformers; docs/roofline-validation.md)

The pinned numbers are floors: tests/test_accuracy.py fails when a case gets worse, so later work can
only raise them (re-pin after an improvement).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from analyzer.cli.check_cmd import check_trace  # noqa: E402
from analyzer.report.accuracy_text import short_name  # noqa: E402

ZOO = ROOT / "fixtures" / "zoo"
DOC = ROOT / "docs" / "accuracy.md"
PINS = ROOT / "tests" / "data" / "zoo_accuracy.json"
BEGIN, END = "<!-- zoo-table:begin (benchmarks/accuracy.py) -->", "<!-- zoo-table:end -->"
ENGINE_BEGIN = "<!-- engine-table:begin (benchmarks/accuracy.py --engines) -->"
ENGINE_END = "<!-- engine-table:end -->"
SHARED = ROOT.parent / "shared" / "traces"
# every trace the project has with engine step annotations (the shared ones, then our own fixtures)
ENGINE_TRACES = [
    "sglang-deepseek-llama8b-decode-mi300x-vs-b300/MI300/1782841132.2905657-TP-0-DECODE.trace.json.gz",
    "sglang-deepseek-llama8b-decode-mi300x-vs-b300/B300/1782843274.7730265-TP-0-DECODE.trace.json.gz",
    "mi300x-sglang-qwen3-8b/sglang_Qwen3-8B_decode.json.gz",
    "mi300x-sglang-qwen3-8b/sglang_Qwen3-8B_prefilldecode.json.gz",
    "mi300x-vllm-gptoss-decode-fullgraph/graph_execution.json.gz",
]
FLOPS_DOC = ROOT / "docs" / "roofline-validation.md"
FLOPS_BEGIN = "<!-- flops-table:begin (benchmarks/accuracy.py --flops) -->"
FLOPS_END = "<!-- flops-table:end -->"
# our own fixtures with engine annotations (the zoo's lkm::step traces are scored by the zoo table)
OWN_ENGINE_TRACES: list[str] = []


def cases() -> list[Path]:
    return sorted(p for p in ZOO.iterdir() if (p / "trace.json.gz").is_file())


def measure(keep_steps: bool = False) -> list[dict[str, Any]]:
    rows = []
    for case in cases():
        r = check_trace(str(case / "trace.json.gz"), keep_steps=keep_steps, worst=3)
        meta = json.loads((case / "meta.json").read_text(encoding="utf-8"))
        rows.append({"case": case.name, "meta": meta, "report": r})
    return rows


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:.1f}"


def _worst(r: dict[str, Any]) -> str:
    out = []
    for d in r["disagreements"]["stage"][:2]:
        out.append(
            f"`{short_name(d['kernel'], 48)}` {d['analyzer']}→{'/'.join(d['accepted'])} ({_pct(d['share'])}%)"
        )
    for d in r["disagreements"]["phase"][:1]:
        out.append(f"phase {d['analyzer']}→{d['truth']} ({_pct(d['share'])}%)")
    if r["phase"].get("undecided"):
        out.append(f"phase left unknown on {_pct(r['phase']['undecided'])}%")
    return "; ".join(out).replace("|", "\\|")


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| case | mode | attn / backend | dtype | shapes | stage % | category % | phase % | step fields wrong / not given | worst kernels |",
        "|---|---|---|---|---|---:|---:|---:|---:|---|",
    ]
    for row in sorted(rows, key=lambda x: x["report"]["stage"]["agreement"] or 0):
        m, r = row["meta"], row["report"]
        attn = m.get("attn", "").replace("|", "\\|") + (
            f" / {m['sdpa_backend']}" if m.get("sdpa_backend") else ""
        )
        mode = (
            m.get("mode", "")
            + (" + draft" if m.get("assistant") else "")
            + (" sampling" if m.get("sampling") else "")
        )
        lines.append(
            f"| {row['case']} | {mode} | {attn} | {m.get('dtype', '')} | {'yes' if m.get('record_shapes') else 'no'} "
            f"| {_pct(r['stage']['agreement'])} | {_pct(r['category']['agreement'])} | {_pct(r['phase']['agreement'])} "
            f"| {steps_wrong(r)} / {_steps_not_given(r)} | {_worst(r)} |"
        )
    return "\n".join(lines) + "\n"


def write_doc(text: str, begin: str = BEGIN, end: str = END, path: Path = DOC) -> None:
    doc = path.read_text(encoding="utf-8")
    if begin not in doc or end not in doc:
        raise SystemExit(f"{path}: the markers {begin} / {end} are missing")
    head, rest = doc.split(begin, 1)
    _, tail = rest.split(end, 1)
    path.write_text(f"{head}{begin}\n{text}{end}{tail}", encoding="utf-8")


def flops_rows() -> list[dict[str, Any]]:
    """Every zoo case against PyTorch's FLOP counter rerun on the CPU (tests/flop_reference.py); a
    case captured without shapes is analysed with ``--model`` its meta.json's config."""
    import tempfile

    from analyzer.errors import InputError
    from tests import flop_reference

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in cases():
            meta = json.loads((case / "meta.json").read_text(encoding="utf-8"))
            row: dict[str, Any] = {"case": case.name, "meta": meta}
            reason = flop_reference.why_not(meta)
            model = None
            if not reason and not meta.get("record_shapes"):
                model = str(Path(tmp) / f"{case.name}.json")
                Path(model).write_text(json.dumps({"model_type": meta["model_type"], **meta["config"]}))
            if not reason:
                try:
                    row["cmp"] = flop_reference.compare(case, model)
                except InputError as e:
                    reason = f"--model cannot read its config: {str(e).split(': ', 1)[-1]}"
            row["skip"] = reason
            rows.append(row)
            print(f"{case.name}: {reason or 'compared'}", file=sys.stderr)
    return rows


def _rel(r: float, a: float) -> float:
    return abs(a - r) / r if r else 0.0


def flops_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| case | shapes | attention | ops paired | worst op % | step totals (basis) | worst total % | reference FLOPs left uncounted % |",
        "|---|---|---|---:|---:|---|---:|---:|",
    ]
    by_rule: dict[str, list[float]] = {}
    by_rule_cases: dict[str, set[str]] = {}
    for row in rows:
        m = row["meta"]
        attn = m.get("attn", "").replace("|", "\\|") + (
            f" / {m['sdpa_backend']}" if m.get("sdpa_backend") else ""
        )
        shapes = "yes" if m.get("record_shapes") else "no"
        if row["skip"]:
            lines.append(
                f"| {row['case']} | {shapes} | {attn} | – | – | not compared: {row['skip']} | – | – |"
            )
            continue
        c = row["cmp"]
        for _, _, rule, r, a in c.ops:
            by_rule.setdefault(rule, []).append(_rel(r, a))
            by_rule_cases.setdefault(rule, set()).add(row["case"])
        worst_op = max((_rel(r, a) for *_, r, a in c.ops), default=None)
        bases = sorted({b for _, _, b, _, _ in c.totals})
        worst_total = max((_rel(r, a) for *_, r, a in c.totals), default=None)
        ref_all = (
            sum(r for *_, r, _ in c.ops) + sum(r for *_, r, _ in c.totals) + sum(r for *_, r in c.uncounted)
        )
        left = sum(r for *_, r in c.uncounted) / ref_all if ref_all else 0.0
        lines.append(
            f"| {row['case']} | {shapes} | {attn} | {len(c.ops)} | {_pct(worst_op)} "
            f"| {len(c.totals)} ({', '.join(bases) or '–'}) | {_pct(worst_total)} | {_pct(left)} |"
        )
    lines += [
        "",
        "Per layout (the analyzer's rule that counted the op; ops paired one to one):",
        "",
        "| rule | ops | cases | worst % |",
        "|---|---:|---:|---:|",
    ]
    for rule in sorted(by_rule):
        errs = by_rule[rule]
        lines.append(f"| `{rule}` | {len(errs)} | {len(by_rule_cases[rule])} | {_pct(max(errs))} |")
    return "\n".join(lines) + "\n"


def engine_rows() -> list[dict[str, Any]]:
    """Each engine trace analysed as it is and without its annotations (skipped when absent)."""
    from analyzer.results.engine_phases import engine_phase_agreement
    from analyzer.runtime.driver import load_inputs

    rows = []
    for rel in [*(str(SHARED / p) for p in ENGINE_TRACES), *(str(ROOT / p) for p in OWN_ENGINE_TRACES)]:
        if not Path(rel).exists():
            print(f"skip {rel}: absent", file=sys.stderr)
            continue
        r = engine_phase_agreement(load_inputs([rel]))
        if not r["engines"]:
            print(f"skip {rel}: no engine step annotations", file=sys.stderr)
            continue
        name = rel.replace(str(SHARED) + "/", "../shared/traces/").replace(str(ROOT) + "/", "")
        rows.append({"trace": name, **r})
    return rows


def engine_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| trace | annotations | truth phases | steps (annotated / without) | agreement % | undecided % | wrong % | phase rules without annotations |",
        "|---|---|---|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| `{r['trace']}` | {', '.join(r['engines'])} | {', '.join(r['truth_phases'])} "
            f"| {r['truth_steps']} / {r['steps']} | {_pct(r['agreement'])} | {_pct(r['undecided'])} "
            f"| {_pct(r['wrong'])} | {', '.join(r['phase_rules'])} |"
        )
    return "\n".join(lines) + "\n"


def steps_wrong(r: dict[str, Any]) -> int:
    """Step fields (phase, token counts, model, verify width) given and wrong, over the paired steps."""
    return sum(v["wrong"] for v in r["steps"]["fields"].values())


def _steps_not_given(r: dict[str, Any]) -> int:
    return sum(v["not_given"] for v in r["steps"]["fields"].values())


def pins(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        row["case"]: {
            **{k: row["report"][k]["agreement"] for k in ("stage", "category", "phase")},
            # floor: agreement where a phase was given; ceiling: the share left unknown
            "phase_decided": row["report"]["phase"]["decided_agreement"],
            "phase_undecided": row["report"]["phase"]["undecided"],
            # ceilings: step fields given and wrong; step fields left null where the truth has them
            "steps_wrong": steps_wrong(row["report"]),
            "steps_not_given": _steps_not_given(row["report"]),
        }
        for row in sorted(rows, key=lambda x: x["case"])
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pin", action="store_true", help="write tests/data/zoo_accuracy.json")
    p.add_argument("--keep-steps", action="store_true", help="keep the step annotations (annotated path)")
    p.add_argument("--no-docs", action="store_true", help="print only; leave docs/accuracy.md as it is")
    p.add_argument(
        "--engines", action="store_true", help="the engine traces without their annotations instead"
    )
    p.add_argument(
        "--flops", action="store_true", help="FLOPs against PyTorch's own counter instead (needs torch)"
    )
    a = p.parse_args(argv)
    if a.flops:
        text = flops_table(flops_rows())
        print(text)
        if not a.no_docs:
            write_doc(text, FLOPS_BEGIN, FLOPS_END, FLOPS_DOC)
            print(f"wrote {FLOPS_DOC.relative_to(ROOT)}", file=sys.stderr)
        return 0
    if a.engines:
        text = engine_table(engine_rows())
        print(text)
        if not a.no_docs:
            write_doc(text, ENGINE_BEGIN, ENGINE_END)
            print(f"wrote {DOC.relative_to(ROOT)}", file=sys.stderr)
        return 0
    rows = measure(a.keep_steps)
    text = table(rows)
    print(text)
    if not a.no_docs and not a.keep_steps:
        write_doc(text)
        print(f"wrote {DOC.relative_to(ROOT)}", file=sys.stderr)
    if a.pin:
        if a.keep_steps:
            raise SystemExit("--pin pins the stripped path: drop --keep-steps")
        PINS.parent.mkdir(parents=True, exist_ok=True)
        PINS.write_text(json.dumps(pins(rows), indent=1, sort_keys=True) + "\n", encoding="utf-8")
        print(f"wrote {PINS.relative_to(ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
