"""Measure the analyzer on the zoo: ``check`` on every ``fixtures/zoo/<case>``, one table row each.

    python benchmarks/accuracy.py            # print the table, rewrite its section of docs/accuracy.md
    python benchmarks/accuracy.py --pin      # also write tests/data/zoo_accuracy.json (the pinned floors)
    python benchmarks/accuracy.py --keep-steps --no-docs   # the annotated path, printed only
    python benchmarks/accuracy.py --engines  # engine traces without their annotations (docs table too)
    python benchmarks/accuracy.py --flops    # FLOPs against PyTorch's own counter, every zoo case
                                             # (needs torch + transformers; docs/roofline-validation.md)
    python benchmarks/accuracy.py --libraries  # the kernel-library and quantized cases (fixtures/libraries)
    python benchmarks/accuracy.py --sweep    # every swept model type (fixtures/sweep): its docs table
    python benchmarks/accuracy.py --sweep --pin --only llama,mamba2   # ... pin tests/data/sweep_accuracy.json

The pinned numbers are floors: tests/test_accuracy.py fails when a case gets worse, so later work can
only raise them (re-pin after an improvement).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import lzma
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from analyzer.cli.check_cmd import check_trace  # noqa: E402
from analyzer.report.accuracy_text import short_name  # noqa: E402

ZOO = ROOT / "fixtures" / "zoo"
LIBRARIES = ROOT / "fixtures" / "libraries"
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
SWEEP = ROOT / "fixtures" / "sweep"
SWEEP_PINS = ROOT / "tests" / "data" / "sweep_accuracy.json"
# the coverage warning every generate capture carries (the ops before the first forward): not a
# warning about the stages, so the sweep's warned / silent counts leave it out
ROUTINE_WARNING = re.compile(r"GPU activities \(.*\) are outside every step")
LIB_BEGIN = "<!-- library-table:begin (benchmarks/accuracy.py --libraries) -->"
LIB_END = "<!-- library-table:end -->"
SWEEP_BEGIN, SWEEP_END = (
    "<!-- sweep-table:begin (benchmarks/accuracy.py --sweep) -->",
    "<!-- sweep-table:end -->",
)


def cases(folder: Path = ZOO) -> list[Path]:
    return sorted(p for p in folder.iterdir() if (p / "trace.json.gz").is_file())


def measure(keep_steps: bool = False, folder: Path = ZOO) -> list[dict[str, Any]]:
    rows = []
    for case in cases(folder):
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


# ----------------------------------------------------------------------------- the sweep


def sweep_index() -> dict[str, Any]:
    """``fixtures/sweep/sweep.json``: every model type of the causal-LM mapping, its status and plan."""
    return json.loads((SWEEP / "sweep.json").read_text(encoding="utf-8"))


@contextlib.contextmanager
def sweep_trace(model_type: str) -> Iterator[str]:
    """The path of a swept type's trace as the readers take it (the committed ``.json.xz``
    decompressed into a temporary file: the readers take plain or gzip JSON)."""
    src = SWEEP / model_type / "trace.json.xz"
    with tempfile.TemporaryDirectory() as tmp:
        dst = Path(tmp) / "trace.json"
        with lzma.open(src, "rb") as f, open(dst, "wb") as g:
            shutil.copyfileobj(f, g, 1 << 20)
        yield str(dst)


def check_swept(model_type: str, worst: int = 3) -> dict[str, Any]:
    from analyzer.cli.check_cmd import check_trace

    with sweep_trace(model_type) as path:
        r = check_trace(path, worst=worst)
    r["trace"] = f"fixtures/sweep/{model_type}/trace.json.xz"
    return r


def measure_sweep(only: list[str] | None = None) -> list[dict[str, Any]]:
    """One row per type of the sweep index: ``check`` on the captured ones, the reason on the rest."""
    rows = []
    for t in sweep_index()["types"]:
        if only and t["model_type"] not in only:
            continue
        row: dict[str, Any] = {"type": t["model_type"], "index": t, "report": None}
        if t["status"] == "captured" and (SWEEP / t["model_type"] / "trace.json.xz").is_file():
            row["report"] = check_swept(t["model_type"])
            print(f"{t['model_type']}: stage {_pct(row['report']['stage']['agreement'])}", file=sys.stderr)
        rows.append(row)
    return rows


def telling_warnings(r: dict[str, Any]) -> list[str]:
    """The analysis's warnings but the routine one (ROUTINE_WARNING)."""
    return [w for w in r.get("warnings") or [] if not ROUTINE_WARNING.search(w)]


#: the analysis's warnings that speak of its stages (issue 33 item 4 counts these): the walk dropped,
#: no LLM structure, kernels placed by position under foreign ops (STR051), GEMM roles in dispute,
#: an activation inside an attention input (STR058), GEMMs without a role inside the layers (STR059)
STAGE_WARNING = re.compile(
    r"layer structure not found|no LLM structure|placed by its position|GEMM roles from shapes"
    r"|activation inside a layer's attention input|GEMMs inside the layers that no role rule explains"
    r"|attention outside every layer"
)


def stage_warnings(r: dict[str, Any]) -> list[str]:
    return [w for w in r.get("warnings") or [] if STAGE_WARNING.search(w)]


def _stage(row: dict[str, Any]) -> float:
    r = row["report"]
    return (r["stage"]["agreement"] or 0.0) if r else 2.0


def sweep_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The counts the issue's targets are stated in (stage / category / phase shares, warned or not)."""
    done = [r["report"] for r in rows if r["report"]]
    # traces whose truth predates a truth rule (sweep.json `truth_note`) are scored, not counted as
    # silent: their disagreement is the truth's
    fresh = [r["report"] for r in rows if r["report"] and not r["index"].get("truth_note")]

    def n(pred: Any, among: list[dict[str, Any]] = done) -> int:
        return sum(1 for r in among if pred(r))

    def silent(r: dict[str, Any]) -> bool:
        return (r["stage"]["agreement"] or 0) < 0.97 and not stage_warnings(r)

    status: dict[str, int] = {}
    for r in rows:
        status[r["index"]["status"]] = status.get(r["index"]["status"], 0) + 1
    return {
        "types": len(rows),
        "status": status,
        "captured": len(done),
        "stage_99": n(lambda r: (r["stage"]["agreement"] or 0) >= 0.99),
        "stage_97": n(lambda r: (r["stage"]["agreement"] or 0) >= 0.97),
        "category_995": n(lambda r: (r["category"]["agreement"] or 0) >= 0.995),
        "phase_decided_995": n(lambda r: (r["phase"]["decided_agreement"] or 0) >= 0.995),
        "phase_undecided": n(lambda r: (r["phase"]["undecided"] or 0) > 0),
        "warned": n(lambda r: bool(telling_warnings(r))),
        "stage_warned": n(lambda r: bool(stage_warnings(r))),
        "below_97_silent": n(silent, fresh),
        "silent_types": sorted(
            row["type"] for row in rows if row["report"] and row["report"] in fresh and silent(row["report"])
        ),
        "stale_truth": len(done) - len(fresh),
        "above_99_warned": n(lambda r: (r["stage"]["agreement"] or 0) >= 0.99 and bool(stage_warnings(r))),
    }


def _kinds(t: dict[str, Any]) -> str:
    pat = [p.split(".")[-1] for p in t.get("pattern") or []]
    return ", ".join(sorted(set(pat)))


def sweep_table(rows: list[dict[str, Any]]) -> str:
    s = sweep_summary(rows)
    st = s["status"]
    head = (
        f"{s['types']} model types in the causal-LM mapping: {st.get('captured', 0)} captured, "
        f"{st.get('skipped', 0)} skipped, {st.get('excluded', 0)} excluded, {st.get('alias', 0)} aliases. "
        f"Of the {s['captured']} captured: stage >= 99% on {s['stage_99']}, >= 97% on {s['stage_97']}; "
        f"category >= 99.5% on {s['category_995']}; phase >= 99.5% where decided on {s['phase_decided_995']} "
        f"(some kernel time left `unknown` on {s['phase_undecided']}). The analysis warned (a warning besides "
        f"the routine 'outside every step' one) on {s['warned']}, about its stages on {s['stage_warned']}: "
        f"below 97% stage and silent {s['below_97_silent']} ({', '.join(s['silent_types']) or 'none'}; "
        f"the {s['stale_truth']} traces with stale truth not counted), >= 99% and warned about its stages "
        f"{s['above_99_warned']} of {s['stage_99']}.\n\n"
    )
    lines = [
        "| type | layers | params | pattern | stage % | category % | phase % | warnings | worst kernels / reason |",
        "|---|---:|---:|---|---:|---:|---:|---:|---|",
    ]
    for row in sorted(rows, key=lambda x: (_stage(x), x["type"])):
        t, r = row["index"], row["report"]
        if r is None:
            why = t.get("reason", "") + (f": `{t['error']}`" if t.get("error") else "")
            lines.append(f"| {row['type']} | | | | | | | | {t['status']}: {why.replace('|', '/')} |")
            continue
        params = f"{t.get('params', 0) / 1e6:.0f}M"
        lines.append(
            f"| {row['type']} | {t.get('layers', '')} | {params} | {_kinds(t)} "
            f"| {_pct(r['stage']['agreement'])} | {_pct(r['category']['agreement'])} "
            f"| {_pct(r['phase']['agreement'])} | {len(telling_warnings(r))} | {_worst(r)}"
            + (f" **Truth:** {t['truth_note']}" if t.get("truth_note") else "")
            + " |"
        )
    return head + "\n".join(lines) + "\n"


def sweep_pins(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        row["type"]: {
            **{k: row["report"][k]["agreement"] for k in ("stage", "category", "phase")},
            "phase_decided": row["report"]["phase"]["decided_agreement"],
            "phase_undecided": row["report"]["phase"]["undecided"],
        }
        for row in sorted(rows, key=lambda x: x["type"])
        if row["report"]
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
    p.add_argument("--sweep", action="store_true", help="every swept model type (fixtures/sweep) instead")
    p.add_argument(
        "--libraries",
        action="store_true",
        help="the kernel-library and quantized cases (fixtures/libraries) instead",
    )
    p.add_argument("--only", default="", help="--sweep: only these types (comma-separated)")
    p.add_argument("--json", dest="json_out", help="--sweep: also write the rows and summary here")
    a = p.parse_args(argv)
    if a.flops:
        text = flops_table(flops_rows())
        print(text)
        if not a.no_docs:
            write_doc(text, FLOPS_BEGIN, FLOPS_END, FLOPS_DOC)
            print(f"wrote {FLOPS_DOC.relative_to(ROOT)}", file=sys.stderr)
        return 0
    if a.sweep:
        return _main_sweep(a)
    if a.libraries:
        text = table(measure(a.keep_steps, LIBRARIES))
        print(text)
        if not a.no_docs and not a.keep_steps:
            write_doc(text, LIB_BEGIN, LIB_END)
            print(f"wrote {DOC.relative_to(ROOT)}", file=sys.stderr)
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


def _main_sweep(a: argparse.Namespace) -> int:
    only = [t for t in a.only.split(",") if t]
    rows = measure_sweep(only or None)
    text = sweep_table(rows)
    print(text)
    if a.json_out:
        doc = {
            "summary": sweep_summary(rows),
            "rows": [{"type": r["type"], "report": r["report"]} for r in rows],
        }
        Path(a.json_out).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    if not a.no_docs and not only:
        write_doc(text, SWEEP_BEGIN, SWEEP_END)
        print(f"wrote {DOC.relative_to(ROOT)}", file=sys.stderr)
    if a.pin:
        pins = sweep_pins(rows)
        if only and SWEEP_PINS.is_file():
            pins = {**json.loads(SWEEP_PINS.read_text(encoding="utf-8")), **pins}
        SWEEP_PINS.parent.mkdir(parents=True, exist_ok=True)
        SWEEP_PINS.write_text(json.dumps(pins, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        print(f"wrote {SWEEP_PINS.relative_to(ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
