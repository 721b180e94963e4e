"""The brief (the summary's ``brief`` block) as rows and as text: ``analyze --brief``.

:func:`brief_rows` turns the block into (section, what, value, evidence) rows, an unknown value as
``unknown`` with its reason: the text and the HTML report both draw these rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar, TextIO

from analyzer.report.formatting import fmt_ns, fmt_pct, write_table

_DIMS = (
    ("hidden", "hidden"),
    ("heads", "heads"),
    ("kv_heads", "KV heads"),
    ("head_dim", "head size"),
    ("ffn", "FFN width"),
    ("layers", "layers"),
    ("experts", "experts"),
    ("top_k", "experts per token"),
    ("expert_ffn", "expert FFN width"),
    ("vocab", "vocabulary"),
)
_TOKENS = (
    ("prefill_per_step", "prefill tokens / step"),
    ("decode_per_step", "decode tokens / step"),
    ("verify_width", "verify width"),
    ("mixed_per_step", "mixed step M (all tokens)"),
    ("mixed_prefill_per_step", "  of which prefill"),
    ("mixed_decode_per_step", "  of which decode"),
)


class BriefTextReporter:
    """The brief of one summary as text."""

    name: ClassVar[str] = "brief"
    extensions: ClassVar[tuple[str, ...]] = ()
    binary: ClassVar[bool] = False

    def render(self, data: dict[str, Any], stream: TextIO) -> None:
        render_brief(data, stream)


def _num(v: Any) -> str:
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    return f"{v:,}" if isinstance(v, int) else f"{v:,.1f}" if isinstance(v, float) else str(v)


def _dist(v: dict[str, Any]) -> str:
    return f"p50 {_num(v['p50'])}, p90 {_num(v['p90'])}, max {_num(v['max'])} ({v['steps']} steps)"


def _cell(item: dict[str, Any], show: Any = None) -> tuple[str, str]:
    """(value, evidence) of one item; an unknown one reads ``unknown`` and its reason."""
    if item is None:
        return "unknown", "not in this summary"
    if "unknown" in item:
        return "unknown", f"because {item['unknown']}"
    v = item.get("value")
    return ("none" if v is None else show(v) if show else _num(v)), item.get("evidence", "")


def brief_rows(brief: dict[str, Any]) -> Iterator[tuple[str, str, str, str]]:
    """(section, what, value, evidence or ``because`` reason) for every value of the brief."""
    for p, r in brief.get("phases", {}).items():
        yield "phases", p, f"{fmt_pct(r['share'])} of kernel time, {r['steps']} steps", r.get("evidence", "")
    tok = brief.get("tokens", {})
    for key, label in _TOKENS:
        if key in tok:
            yield ("tokens", label, *_cell(tok[key], _dist))
    model = brief.get("model", {})
    per = model.get("per_rank", {})
    for key, label in _DIMS:
        if key in per:
            yield ("model (per rank)" if model.get("whole") else "model", label, *_cell(per[key]))
    for key, label in _DIMS:
        if model.get("whole") and key in model["whole"]:
            yield ("model (whole)", label, *_cell(model["whole"][key]))
    check = model.get("check")
    if check:
        bad = check.get("disagreements") or []
        text = (
            "; ".join(bad) if bad else ("agrees" if check.get("checked") else "not checked: no sizes found")
        )
        yield "model", f"--model {check['model']}", "disagrees" if bad else text, text if bad else ""
    for key, item in brief.get("dtypes", {}).items():
        yield ("dtypes", key, *_cell(item, _dtype))
    kv = brief.get("kv_cache", {})
    for key, label in (
        ("layout", "layout"),
        ("block_size", "block size"),
        ("gqa_group", "query heads per KV head"),
        ("dtype", "dtype"),
        ("bytes_per_token", "bytes per token"),
    ):
        if key in kv:
            yield ("KV cache", label, *_cell(kv[key]))
    if "hardware" in brief:
        yield ("hardware", "GPU", *_cell(brief["hardware"], _gpu))
    if "speculative" in brief:
        yield ("speculative decoding", "draft / verify", *_cell(brief["speculative"], _spec))
    lat = brief.get("latency", {})
    if "prefill_step_ns" in lat:
        yield ("latency", "prefill step (TTFT floor)", *_cell(lat["prefill_step_ns"], _times))
    if "decode_step_ns" in lat:
        yield ("latency", "decode step (ITL floor)", *_cell(lat["decode_step_ns"], _decode_times))
        for b in (lat["decode_step_ns"].get("value") or {}).get("per_batch", []):
            yield (
                "latency",
                f"  {b['tokens']} tokens / step",
                f"p50 {fmt_ns(b['p50'])}, p99 {fmt_ns(b['p99'])} ({b['steps']} steps)",
                "",
            )

    inter = brief.get("interference", {})
    for side in ("decode", "prefill"):
        if side in inter:
            yield ("continuous batching", f"per {side} token: mixed vs pure", *_cell(inter[side], _mixed))


def _ratio(r: dict[str, Any]) -> str:
    return f"x{r['ratio']:.2f}" if r.get("ratio") is not None else "no pure time"


def _mixed(v: dict[str, Any]) -> str:
    t = v["total"]
    return (
        f"{fmt_ns(t['mixed_ns_per_token'])} vs {fmt_ns(t['pure_ns_per_token'])} ({_ratio(t)}; "
        f"{v['mixed_steps']} mixed / {v['pure_steps']} pure steps, "
        f"{v['mixed_tokens']:,} / {v['pure_tokens']:,} tokens)"
    )


def interference_rows(inter: dict[str, Any], top: int = 10) -> list[list[str]]:
    """(token kind, stage, mixed per token, pure per token, ratio) of the known sides, the stages
    with the most mixed-step time first, each side's total first."""
    rows = []
    for side in ("decode", "prefill"):
        v = (inter.get(side) or {}).get("value")
        if not v:
            continue
        for r in [{"stage": "all stages", **v["total"]}, *v["stages"][:top]]:
            rows.append(
                [side, r["stage"], fmt_ns(r["mixed_ns_per_token"]), fmt_ns(r["pure_ns_per_token"]), _ratio(r)]
            )
    return rows


INTERFERENCE_HEADER = ["per token of", "stage", "mixed steps", "pure steps", "mixed / pure"]


def _dtype(v: dict[str, Any]) -> str:
    if "written" in v:
        return f"written {v['written']}"
    if "compute" in v:
        return f"computes in {v['compute']}"
    second = "weight" if "weight" in v else "key"
    q = " (quantized)" if v.get("quantized") else ""
    return f"activation {v.get('activation')}, {second} {v.get(second)}{q}"


def _gpu(v: dict[str, Any]) -> str:
    fp8 = f", fp8 {_num(v['fp8_tflops'])} TFLOP/s" if v.get("fp8") else ", no fp8 peak"
    return f"{v['name']} ({v.get('arch')}): HBM {v.get('hbm_tbps')} TB/s, bf16 {_num(v.get('bf16_tflops'))} TFLOP/s{fp8}"


def _spec(v: dict[str, Any]) -> str:
    w = v.get("verify_width")
    width = f", verify width {_dist(w)}" if w else ""
    return f"{v['draft_steps']} draft steps, {v['target_steps']} target steps{width}"


def _times(v: dict[str, Any]) -> str:
    return (
        f"first {fmt_ns(v['first'])}, p50 {fmt_ns(v['p50'])}, max {fmt_ns(v['max'])} "
        f"({v['steps']} steps; kernels p50 {fmt_ns(v['kernel_p50'])})"
    )


def _decode_times(v: dict[str, Any]) -> str:
    return f"p50 {fmt_ns(v['p50'])}, p99 {fmt_ns(v['p99'])} ({v['steps']} steps; kernels p50 {fmt_ns(v['kernel_p50'])})"


def render_brief(summary: dict[str, Any], out: TextIO) -> None:
    """The brief of ``summary`` as text: one line per value, its evidence or why it is unknown,
    then the headroom ranking."""
    brief = summary.get("brief") or {}
    out.write("Brief: what to know before tuning a prefill or decode kernel (evidence, or why unknown)\n")
    section = None
    for sec, what, value, why in brief_rows(brief):
        if sec != section:
            out.write(f"{sec}\n")
            section = sec
        out.write(f"  {what:<28} {value}" + (f"  [{why}]" if why else "") + "\n")
    rows = interference_rows(brief.get("interference") or {})
    if rows:
        out.write("continuous batching: kernel time per token, mixed steps vs pure steps, by stage\n")
        write_table(out, INTERFERENCE_HEADER, rows)
    _headroom(brief.get("headroom") or {}, out)


def _headroom(h: dict[str, Any], out: TextIO, top: int = 10) -> None:
    if not h:
        return
    target = h.get("roof_target", 0.8)
    out.write(f"headroom: time saved if every kernel reached {fmt_pct(target)} of its roof, ranked\n")
    if h.get("unknown"):
        out.write(f"  unknown, because {h['unknown']}\n")
    rows = [
        [
            str(r["rank"]),
            r["phase"],
            r["stage"],
            fmt_ns(r["time_ns"]),
            fmt_pct(r["pct_of_peak"]),
            fmt_ns(r["saved_ns"]),
        ]
        for r in h.get("rows", [])[:top]
    ]
    if rows:
        write_table(out, ["#", "phase", "stage", "time", "of roof", "saved"], rows)
    un = h.get("uncounted", [])
    if un:
        out.write("  without a rate (not in the ranking):\n")
        rows = [
            [r["phase"], r["stage"], fmt_ns(r["time_ns"]), str(r["kernels"]), ", ".join(r["reasons"])]
            for r in un[:top]
        ]
        write_table(out, ["phase", "stage", "time", "kernels", "why"], rows, indent="    ")
