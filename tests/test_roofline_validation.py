"""Roofline bytes against Nsight Compute on an H200 (issue "Roofline", item 4; docs/roofline-validation.md).

GIVEN one prefill step and one decode step of a Llama-3-8B-shaped model (4 layers, batch 4, prompt
512, bf16, random weights; ``fixtures/roofline-validation/make_validation.py``) recorded twice on an
H200 with the same launches: once under torch.profiler (``trace.json.gz``) and once under ``ncu
--cache-control all --clock-control none`` (``ncu.csv``: DRAM bytes read and written, and the
sectors the SMs stored into L2, per kernel), for the transformers model and for the reference decoder;
WHEN the local analyzer reads the trace and its kernels are matched to ncu's by launch order and name;
THEN

* decode: every GEMM, attention and norm kernel moving over 1 MB is within 15 % of the measured DRAM
  read + write bytes;
* prefill: the analyzer's bytes never exceed the kernel's measured traffic by more than 15 %. The
  traffic is DRAM reads plus the bytes the kernel stores: ncu flushes the caches before each kernel,
  so every input byte comes from DRAM, but a kernel's stores stay in the 60 MB L2 when it ends and
  reach DRAM only after (in the flush before the next kernel), so ``dram__bytes_write`` misses them.

Numbers of a host op land on its longest kernel (roofline contract); its helper kernels (split-K
reduce, split-KV combine) are compared together with it, as one op.
"""

from __future__ import annotations

import csv
import functools
import sys
from pathlib import Path

import pandas as pd
import pytest

from analyzer.pipeline import Analysis
from tests.runs import analyze_paths

ROOT = Path(__file__).resolve().parents[1] / "fixtures" / "roofline-validation"
CASES = ("hf-llama3-8b-l4", "reference-llama3-8b-l4")
TOLERANCE = 0.15
BIG = 1 << 20  # "moving over 1 MB"
SECTOR = 32
GEMM_STAGES = {
    "qkv_gemm",
    "o_gemm",
    "gate_up_gemm",
    "down_gemm",
    "lm_head_gemm",
    "moe_gate_gemm",
    "gemm",
    "moe_expert_gemm",
}
ATTENTION_STAGES = {"flash_attention", "paged_attention", "attention_reduce", "mla_attention"}
DECODE_TARGET = GEMM_STAGES | ATTENTION_STAGES | {"norm"}
# reductions whose output is far smaller than their input (roofline charges the input plus nothing more)
REDUCTIONS = {
    "aten::mean",
    "aten::sum",
    "aten::argmax",
    "aten::argmin",
    "aten::amax",
    "aten::amin",
    "aten::max",
    "aten::min",
    "aten::norm",
    "aten::linalg_vector_norm",
    "aten::var_mean",
}
# weight GEMMs of one decode step: q, k, v, o, gate, up, down per layer (transformers) or qkv, o,
# gate_up, down (reference), and the LM head
DECODE_GEMMS = {"hf-llama3-8b-l4": 7 * 4 + 1, "reference-llama3-8b-l4": 4 * 4 + 1}


def read_ncu(path: Path) -> pd.DataFrame:
    """ncu ``--csv --page raw --print-units base``: a header row, a units row, one row per kernel."""
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(f) if r]
    start = next(i for i, r in enumerate(rows) if r and r[0] == "ID")
    header, data = rows[start], rows[start + 2 :]
    df = pd.DataFrame(data, columns=header)

    def num(col: str) -> pd.Series:
        return pd.to_numeric(df[col].str.replace(",", ""), errors="raise").astype("float64")

    return (
        pd.DataFrame(
            {
                "ncu_id": num("ID").astype(int),
                "ncu_name": df["Kernel Name"],
                "dram_read": num("dram__bytes_read.sum"),
                "dram_write": num("dram__bytes_write.sum"),
                "stored": SECTOR * num("lts__t_sectors_srcunit_tex_op_write.sum"),
                "ncu_dur_ns": num("gpu__time_duration.sum"),
            }
        )
        .sort_values("ncu_id", kind="stable")
        .reset_index(drop=True)
    )


@functools.cache
def analysis(case: str) -> Analysis:
    return analyze_paths([str(ROOT / case / "trace.json.gz")])


@functools.cache
def matched(case: str) -> pd.DataFrame:
    """The analyzer's kernels (GPU kernels only, in launch order) side by side with ncu's rows."""
    a = analysis(case)
    k = a.kernels.to_pandas()
    k = k[k["kind"] == "kernel"].sort_values(["start_ns"], kind="stable").reset_index(drop=True)
    ops = a.trace.host_ops.select(["external_id", "name", "category"]).to_pandas()
    ops = ops[ops["category"].astype(str) == "cpu_op"].drop_duplicates("external_id", keep="last")
    op_name = dict(zip(ops["external_id"], ops["name"].astype(str), strict=True))
    n = read_ncu(ROOT / case / "ncu.csv")
    assert len(k) == len(n), f"{case}: {len(k)} kernels in the trace, {len(n)} in ncu's CSV"
    m = pd.concat(
        [k[["name", "stage", "phase", "step", "launch_op_id", "bytes", "flops", "dur_ns"]], n], axis=1
    )
    m["op_name"] = [op_name.get(int(e)) if pd.notna(e) else None for e in m["launch_op_id"]]
    return m


def per_op(m: pd.DataFrame) -> pd.DataFrame:
    """One row per host op: its kernels' analyzer bytes (on the lead kernel) and measured traffic."""
    own = pd.Series(-1 - m.index.to_numpy(), index=m.index)  # a kernel without a host op is its own op
    key = m["launch_op_id"].astype("float64").fillna(own)
    # consecutive kernels of one op form one group (ops do not interleave on one stream)
    m = m.assign(group=(key != key.shift()).cumsum().to_numpy())
    lead = m.sort_values("dur_ns", ascending=False, kind="stable").drop_duplicates("group").set_index("group")
    g = m.groupby("group", sort=True)
    out = pd.DataFrame(
        {
            "phase": lead["phase"],
            "stage": lead["stage"],
            "op_name": lead["op_name"],
            "kernel": lead["ncu_name"],
            "kernels": g.size(),
            "bytes": g["bytes"].sum(min_count=1),
            "dram_read": g["dram_read"].sum(),
            "dram_write": g["dram_write"].sum(),
            "stored": g["stored"].sum(),
            "dur_ns": g["dur_ns"].sum(),
        }
    ).sort_index()
    out["dram"] = out["dram_read"] + out["dram_write"]
    out["traffic"] = out["dram_read"] + out["stored"]
    out["err_dram"] = (out["bytes"] - out["dram"]) / out["dram"]
    out["err_traffic"] = (out["bytes"] - out["traffic"]) / out["traffic"]
    return out


def decode_targets(case: str) -> pd.DataFrame:
    ops = per_op(matched(case))
    moving = ops[["bytes", "dram"]].max(axis=1, skipna=True) > BIG
    return ops[(ops["phase"] == "decode") & ops["stage"].isin(DECODE_TARGET) & moving]


def prefill_targets(case: str) -> pd.DataFrame:
    ops = per_op(matched(case))
    moving = ops[["bytes", "traffic"]].max(axis=1, skipna=True) > BIG
    return ops[(ops["phase"] == "prefill") & ops["bytes"].notna() & moving]


def _show(rows: pd.DataFrame, err: str) -> str:
    return "; ".join(
        f"{r.stage} {r.op_name} {r.kernel[:48]}: analyzer {r.bytes / 1e6:.2f} MB vs "
        f"{(r.dram if err == 'err_dram' else r.traffic) / 1e6:.2f} MB ({100 * getattr(r, err):+.1f}%)"
        for r in rows.itertuples()
    )


# ----------------------------------------------------------------------------------------- tests


@pytest.mark.parametrize("case", CASES)
def test_kernels_match_ncu_by_launch_order_and_name(case: str) -> None:
    m = matched(case)
    wrong = m[[n not in t for n, t in zip(m["ncu_name"], m["name"], strict=True)]]
    assert wrong.empty, f"{case}: launch order differs at ncu IDs {wrong['ncu_id'].tolist()[:5]}"
    assert analysis(case).annotations_found == ["lkm"]
    assert {"prefill", "decode"} <= set(m["phase"]) <= {"prefill", "decode", "unknown"}


@pytest.mark.parametrize("case", CASES)
def test_decode_step_holds_every_weight_gemm(case: str) -> None:
    """The decode step's own GEMMs are labelled decode (a prerequisite of the decode target)."""
    ops = per_op(matched(case))
    weights = ops[["bytes", "dram"]].max(axis=1, skipna=True) > BIG  # not RoPE's tiny position bmm
    decode_gemms = ops[(ops["phase"] == "decode") & ops["stage"].isin(GEMM_STAGES) & weights]
    assert len(decode_gemms) == DECODE_GEMMS[case], (
        f"{case}: {len(decode_gemms)} GEMM ops labelled decode, expected {DECODE_GEMMS[case]}; phases by op: "
        f"{ops.groupby('phase').size().to_dict()}"
    )


@pytest.mark.parametrize("case", CASES)
def test_decode_bytes_within_15pct_of_dram(case: str) -> None:
    rows = decode_targets(case)
    assert len(rows) >= DECODE_GEMMS[case]
    missing = rows[rows["bytes"].isna()]
    assert missing.empty, f"{case}: no bytes for {_show(missing.fillna(0), 'err_dram')}"
    off = rows[rows["err_dram"].abs() > TOLERANCE]
    assert off.empty, f"{case}: decode bytes off by more than 15%: {_show(off, 'err_dram')}"


@pytest.mark.parametrize("case", CASES)
def test_prefill_bytes_never_exceed_traffic(case: str) -> None:
    rows = prefill_targets(case)
    rows = rows[~rows["op_name"].isin(REDUCTIONS)]
    assert len(rows) >= 10
    over = rows[rows["err_traffic"] > TOLERANCE]
    assert over.empty, (
        f"{case}: prefill bytes exceed the measured traffic by > 15%: {_show(over, 'err_traffic')}"
    )


@pytest.mark.parametrize("case", CASES)
def test_prefill_reductions_never_exceed_traffic(case: str) -> None:
    rows = prefill_targets(case)
    rows = rows[rows["op_name"].isin(REDUCTIONS)]
    assert len(rows) > 0
    over = rows[rows["err_traffic"] > TOLERANCE]
    assert over.empty, f"{case}: {_show(over, 'err_traffic')}"


@pytest.mark.parametrize("case", CASES)
def test_prefill_dram_shortfall_is_stores_left_in_l2(case: str) -> None:
    """Where the analyzer exceeds DRAM read + write, the stores still in L2 account for the excess."""
    rows = prefill_targets(case)
    rows = rows[~rows["op_name"].isin(REDUCTIONS) & (rows["err_dram"] > TOLERANCE)]
    unexplained = rows[rows["bytes"] - rows["dram"] > (1 + TOLERANCE) * (rows["stored"] - rows["dram_write"])]
    assert unexplained.empty, f"{case}: {_show(unexplained, 'err_dram')}"


# ------------------------------------------------------------------------------ the docs table


def _mb(x: float) -> str:
    return "-" if pd.isna(x) else f"{x / 1e6:.2f}"


def _pct(x: float) -> str:
    return "-" if pd.isna(x) else f"{100 * x:+.1f}%"


def markdown(case: str) -> str:
    """The tables of docs/roofline-validation.md for one case: every decode op over 1 MB, and the
    prefill ops over 1 MB grouped by stage, host op and kernel (count, summed bytes, error range)."""
    ops = per_op(matched(case))
    ops = ops[ops[["bytes", "dram", "traffic"]].max(axis=1, skipna=True) > BIG]
    out = [
        f"Decode step, every op moving over 1 MB ({case}):",
        "",
        "| stage | host op | kernel (ncu) | kernels | analyzer MB | DRAM read MB | DRAM write MB | stored MB "
        "| vs DRAM r+w | vs read+stored |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in ops[ops["phase"] == "decode"].itertuples():
        out.append(
            f"| {r.stage} | {r.op_name} | `{r.kernel[:56]}` | {r.kernels} | {_mb(r.bytes)} | "
            f"{_mb(r.dram_read)} | {_mb(r.dram_write)} | {_mb(r.stored)} | {_pct(r.err_dram)} | "
            f"{_pct(r.err_traffic)} |"
        )
    pre = ops[ops["phase"] == "prefill"].fillna({"op_name": "-"})
    out += [
        "",
        f"Prefill step, ops moving over 1 MB grouped by stage, host op and kernel ({case}):",
        "",
        "| stage | host op | kernel (ncu) | ops | analyzer MB | DRAM r+w MB | read+stored MB "
        "| vs DRAM r+w (min..max) | vs read+stored (min..max) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for (stage, op, kernel), g in pre.groupby(["stage", "op_name", "kernel"], sort=False):
        out.append(
            f"| {stage} | {op} | `{kernel[:56]}` | {len(g)} | {_mb(g['bytes'].sum(min_count=1))} | "
            f"{_mb(g['dram'].sum())} | {_mb(g['traffic'].sum())} | "
            f"{_pct(g['err_dram'].min())}..{_pct(g['err_dram'].max())} | "
            f"{_pct(g['err_traffic'].min())}..{_pct(g['err_traffic'].max())} |"
        )
    return "\n".join(out)


if __name__ == "__main__":  # python tests/test_roofline_validation.py > tables.md
    for c in sys.argv[1:] or CASES:
        print(f"#### {c}\n\n{markdown(c)}\n")
