"""The analyzer's FLOPs against Nsight Compute's tensor-core counters on an H200 (issue 32 item 4b;
docs/roofline-validation.md, "Nsight Compute FLOP counters").

GIVEN 22 ops run one at a time on an H200 (``fixtures/roofline-validation/make_flops.py``): GEMMs in
bf16, fp16, fp8 (``_scaled_mm``, per-tensor and per-row scales), int8 (``_int_mm``), int4 and int8
weight-only (``_weight_int4pack_mm``, ``_weight_int8pack_mm``), SDPA prefill (flash, cuDNN,
memory-efficient; causal and not) and decode, and MoE experts (``_grouped_mm``), large and skinny,
recorded twice with the same launches: under torch.profiler (``trace.json.gz``, each op in an
``ncu-case/<name>`` range) and under ``ncu`` (``ncu.csv``: the tensor-pipe math-op counters, CUDA-core
FMA counts, DRAM bytes and the sectors stored into L2, per kernel);
WHEN the local analyzer reads the trace and its kernels are matched to ncu's by launch order and name;
THEN

* every large-M, tile-aligned product is within 5 % of the tensor-core work the counters read;
* every other op's executed / useful ratio is the one its kernel's tiles give: a skinny M padded to
  the tile's rows, a causal prefill whose diagonal tiles run whole, a decode query padded to a query
  tile, the whole score matrix of an attention that is not causal (the analyzer takes every
  multi-query attention as causal: the one convention);
* the bytes stay within the bounds of the bytes check: memory-bound ops within 15 % of DRAM read +
  write, and no op above 1.15 x its DRAM reads plus the bytes it stored.

The counters count one multiply-add as 2 (a 4096^3 bf16 GEMM reads 2 x 4096^3, docs/roofline-validation.md), as the
analyzer counts FLOPs. Regenerate the docs table: ``python tests/test_roofline_flops.py --write``.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import json
import math
import sys
from pathlib import Path

import pandas as pd
import pytest

from analyzer.pipeline import Analysis
from tests.runs import analyze_paths

REPO = Path(__file__).resolve().parents[1]
ROOT = REPO / "fixtures" / "roofline-validation" / "ncu-flops"
DOC = REPO / "docs" / "roofline-validation.md"
BEGIN = "<!-- ncu-flops-table:begin (python tests/test_roofline_flops.py --write) -->"
END = "<!-- ncu-flops-table:end -->"
ALIGNED_TOLERANCE = 0.05  # the target for large-M, tile-aligned products
MODEL_TOLERANCE = 0.01  # a ratio the tiles explain, to within
BYTES_TOLERANCE = 0.15  # the bytes check's bounds
SECTOR = 32
#: tensor-pipe math ops by source type (disjoint; fp8's sparsity_on / _off split it again)
TENSOR_COUNTERS = (
    "sm__ops_path_tensor_src_bf16_dst_fp32.sum",
    "sm__ops_path_tensor_src_fp16.sum",
    "sm__ops_path_tensor_src_fp8.sum",
    "sm__ops_path_tensor_src_int8.sum",
    "sm__ops_path_tensor_src_tf32_dst_fp32.sum",
    "sm__ops_path_tensor_src_fp64.sum",
    "sm__ops_path_tensor_src_int1.sum",
)
FFMA = "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum"


def padded(rows: int, tile: int) -> float:
    """Executed over useful rows when ``rows`` run in tiles of ``tile`` rows."""
    return math.ceil(rows / tile) * tile / rows


def causal_tiles(s: int, bm: int, bn: int) -> float:
    """Executed over useful (query, key) pairs of a causal prefill of ``s`` tokens run in tiles of
    ``bm`` queries x ``bn`` keys that skip the tiles above the diagonal and run the others whole."""
    run = sum(min(bm, s - i) * min(s, math.ceil(min(i + bm, s) / bn) * bn) for i in range(0, s, bm))
    return run / (s * (s + 1) / 2)


@dataclasses.dataclass(frozen=True)
class Expect:
    """What the kernel should execute for one case: ``ratio`` x the analyzer's useful FLOPs (None: a
    bound only, ``at_most``), ``tile`` a string of the kernel name that shows the tile the ratio comes
    from, ``why`` the table's words."""

    ratio: float | None
    tile: str
    why: str
    at_most: float | None = None


S = 1024
EXPECT = {
    "mm-bf16-4096": Expect(padded(4096, 256), "256x128", "aligned"),
    "mm-fp16-4096": Expect(padded(4096, 256), "256x128", "aligned"),
    "mm-bf16-3000": Expect(padded(3000, 256), "256x128", "M 3000 runs as 3072 rows (256-row tiles)"),
    "mm-bf16-m16": Expect(padded(16, 16), "64x16", "M 16 fills the 16-row side of a 64x16 tile"),
    "mm-bf16-m4": Expect(padded(4, 8), "64x8", "M 4 in the 8-row side of a 64x8 tile"),
    "mm-fp16-m16": Expect(padded(16, 16), "128x16", "M 16 fills the 16-row side of a 128x16 tile"),
    "scaled-mm-fp8-tensor-4096": Expect(padded(4096, 128), "128x128", "aligned"),
    "scaled-mm-fp8-row-4096": Expect(padded(4096, 128), "128x128", "aligned"),
    "scaled-mm-fp8-row-m16": Expect(padded(16, 128), "128x128", "M 16 in 128-row tiles"),
    "int-mm-int8-4096": Expect(padded(4096, 128), "128x256", "aligned"),
    "int-mm-int8-m32": Expect(padded(32, 64), "64x64", "M 32 in 64-row tiles"),
    "int4pack-mm-m16": Expect(
        padded(16, 16), "m16n8k16", "int4 dequantized to bf16 in the kernel; M 16 fills the m16n8k16 MMA"
    ),
    "int4pack-mm-2048": Expect(
        padded(2048, 16), "m16n8k16", "aligned; int4 dequantized to bf16 in the kernel"
    ),
    "int8pack-mm-m16": Expect(
        1.0, "weight_int8pack_mm_kernel", "no tensor cores: fp32 FMAs on the CUDA cores"
    ),
    "sdpa-flash-causal": Expect(
        causal_tiles(S, 128, 64),
        "Flash_fwd_kernel_traits<128, 128, 64",
        "causal: 128 x 64 tiles on the diagonal run whole",
    ),
    "sdpa-flash-full": Expect(
        S * S / (S * (S + 1) / 2),
        "Flash_fwd_kernel_traits<128, 128, 64",
        "not causal: the kernel runs the whole score matrix, the analyzer counts half (convention)",
    ),
    "sdpa-cudnn-causal": Expect(
        causal_tiles(S, 64, 128), "64x128x128", "causal: 64 x 128 tiles on the diagonal run whole"
    ),
    "sdpa-efficient-causal": Expect(
        None,
        "64x128",
        "causal: 64 x 128 tiles, part of the diagonal ones skipped",
        at_most=causal_tiles(S, 64, 128),
    ),
    "sdpa-flash-decode": Expect(
        padded(1, 128), "Flash_fwd_kernel_traits<128, 128, 64", "decode: 1 query in a 128-query tile"
    ),
    "sdpa-cudnn-decode": Expect(padded(1, 16), "16x128x128", "decode: 1 query in a 16-query tile"),
    "grouped-mm-8x1024": Expect(padded(1024, 128), "MMA_64x256x16", "aligned (1024 rows an expert)"),
    "grouped-mm-8x8": Expect(padded(8, 128), "MMA_64x128x16", "8 rows an expert in 128-row tiles"),
}


def read_ncu(path: Path) -> pd.DataFrame:
    """ncu ``--csv --page raw --print-units base``: a header row, a units row, one row per kernel;
    the numeric columns as float64."""
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(f) if r]
    start = next(i for i, r in enumerate(rows) if r and r[0] == "ID")
    df = pd.DataFrame(rows[start + 2 :], columns=rows[start])
    out = pd.DataFrame({"ncu_id": df["ID"].astype(int), "ncu_name": df["Kernel Name"]})
    for c in df.columns:
        if c.endswith(".sum"):
            out[c] = pd.to_numeric(df[c].str.replace(",", ""), errors="raise").astype("float64")
    return out.sort_values("ncu_id", kind="stable").reset_index(drop=True)


@functools.cache
def meta() -> dict:
    return json.loads((ROOT / "meta.json").read_text())


@functools.cache
def analysis() -> Analysis:
    return analyze_paths([str(ROOT / "trace.json.gz")])


@functools.cache
def matched() -> pd.DataFrame:
    """The analyzer's GPU kernels in launch order beside ncu's rows, each with its case (the
    ``ncu-case/<name>`` range around its launching op) and its launching op's name."""
    a = analysis()
    k = a.kernels.to_pandas()
    k = k[k["kind"] == "kernel"].sort_values(["start_ns"], kind="stable").reset_index(drop=True)
    ops = a.trace.host_ops.select(["external_id", "name", "category", "start_ns"]).to_pandas()
    ops = ops[ops["category"].astype(str) == "cpu_op"].drop_duplicates("external_id", keep="last")
    ops = ops.set_index("external_id")
    prefix = meta()["case_prefix"]
    ranges = a.trace.annotations.to_pandas()
    ranges = ranges[(ranges["side"] == "cpu") & ranges["name"].str.startswith(prefix)]

    def case_of(at: float) -> str | None:
        inside = ranges[(ranges["start_ns"] <= at) & (ranges["end_ns"] >= at)]
        return inside["name"].iloc[0].removeprefix(prefix) if len(inside) else None

    launch = [ops["start_ns"].get(e) if pd.notna(e) else None for e in k["launch_op_id"]]
    n = read_ncu(ROOT / "ncu.csv")
    assert len(k) == len(n), f"{len(k)} kernels in the trace, {len(n)} in ncu's CSV"
    m = pd.concat([k[["name", "stage", "launch_op_id", "flops", "bytes", "bound", "dur_ns"]], n], axis=1)
    m["op_name"] = [ops["name"].get(e) if pd.notna(e) else None for e in k["launch_op_id"]]
    m["case"] = [case_of(t) if t is not None else None for t in launch]
    return m


@dataclasses.dataclass(frozen=True)
class Row:
    """One case: the analyzer's numbers for its op and what its kernels executed and moved."""

    case: str
    kind: str
    op: str
    dtype: str
    shape: str
    aligned: bool
    kernel: str
    flops: float  # the analyzer's, on the case op's kernels
    counters: tuple[str, ...]  # the counters that read the executed work
    executed: float
    bytes: float  # the analyzer's, on every kernel of the case
    dram: float
    traffic: float  # DRAM reads + the bytes stored into L2
    bound: str
    expect: Expect

    @property
    def ratio(self) -> float:
        return self.executed / self.flops


@functools.cache
def rows() -> tuple[Row, ...]:
    m = matched()
    out = []
    for c in meta()["cases"]:
        g = m[m["case"] == c["name"]]
        own = g[g["op_name"] == c["op"]]
        tensor = {t: float(g[t].sum()) for t in TENSOR_COUNTERS if t in g and g[t].sum() > 0}
        if tensor:
            counters, executed = tuple(tensor), sum(tensor.values())
        else:  # no tensor-core work: the CUDA cores' fp32 multiply-adds, 2 FLOPs each
            counters, executed = (f"2 x {FFMA}",), 2.0 * float(g[FFMA].sum())
        lead = own.sort_values("dur_ns", ascending=False).iloc[0] if len(own) else None
        out.append(
            Row(
                case=c["name"],
                kind=c["kind"],
                op=c["op"],
                dtype=c["dtype"],
                shape=c["shape"],
                aligned=bool(c["aligned"]),
                kernel=str(lead["ncu_name"]) if lead is not None else "-",
                flops=float(own["flops"].sum()),
                counters=counters,
                executed=executed,
                bytes=float(g["bytes"].sum()),
                dram=float((g["dram__bytes_read.sum"] + g["dram__bytes_write.sum"]).sum()),
                traffic=float(
                    (g["dram__bytes_read.sum"] + SECTOR * g["lts__t_sectors_srcunit_tex_op_write.sum"]).sum()
                ),
                bound=str(lead["bound"]) if lead is not None else "-",
                expect=EXPECT[c["name"]],
            )
        )
    return tuple(out)


def _row(case: str) -> Row:
    return next(r for r in rows() if r.case == case)


# ----------------------------------------------------------------------------------------- tests


def test_kernels_match_ncu_by_launch_order_and_name() -> None:
    m = matched()
    wrong = m[[n not in t for n, t in zip(m["ncu_name"], m["name"], strict=True)]]
    assert wrong.empty, f"launch order differs at ncu IDs {wrong['ncu_id'].tolist()[:5]}"
    assert m["case"].notna().all(), "a kernel outside every ncu-case range"


def test_every_case_ran_and_has_flops() -> None:
    names = [c["name"] for c in meta()["cases"]]
    assert not meta()["failed"]
    assert names == list(EXPECT), "the harness's cases and this test's expectations differ"
    for r in rows():
        assert r.flops > 0, f"{r.case}: the analyzer counts no FLOPs for {r.op}"
        assert r.executed > 0, f"{r.case}: the counters read no work"
        names = matched().loc[matched()["case"] == r.case, "name"]
        assert any(r.expect.tile in n for n in names), f"{r.case}: no kernel shows the tile {r.expect.tile!r}"


ALIGNED = [c["name"] for c in json.loads((ROOT / "meta.json").read_text())["cases"] if c["aligned"]]


def test_aligned_cases_are_the_products_the_tiles_fill() -> None:
    assert ALIGNED == [c for c, e in EXPECT.items() if e.why.startswith("aligned")]
    assert len(ALIGNED) >= 7  # bf16, fp16, fp8 x 2, int8, int4 weight-only, MoE experts


@pytest.mark.parametrize("case", ALIGNED)
def test_aligned_products_within_5pct_of_the_tensor_counters(case: str) -> None:
    r = _row(case)
    assert abs(r.ratio - 1) <= ALIGNED_TOLERANCE, (
        f"{case}: analyzer {r.flops:.6g} FLOPs, {' + '.join(r.counters)} = {r.executed:.6g} ({r.ratio:.4f})"
    )


@pytest.mark.parametrize("case", list(EXPECT))
def test_executed_over_useful_is_what_the_tiles_give(case: str) -> None:
    r = _row(case)
    e = r.expect
    if e.ratio is None:
        assert 1.0 <= r.ratio <= (e.at_most or math.inf) * (1 + MODEL_TOLERANCE), f"{case}: {r.ratio:.4f}"
        return
    assert abs(r.ratio / e.ratio - 1) <= MODEL_TOLERANCE, (
        f"{case}: executed / useful {r.ratio:.4f}, the tiles give {e.ratio:.4f} ({e.why})"
    )


@pytest.mark.parametrize("case", list(EXPECT))
def test_bytes_within_the_bounds_of_the_bytes_check(case: str) -> None:
    r = _row(case)
    assert r.bytes <= (1 + BYTES_TOLERANCE) * r.traffic, (
        f"{case}: analyzer {r.bytes / 1e6:.2f} MB > 1.15 x read+stored {r.traffic / 1e6:.2f} MB"
    )
    if r.bound == "memory":
        assert abs(r.bytes / r.dram - 1) <= BYTES_TOLERANCE, (
            f"{case}: memory-bound, analyzer {r.bytes / 1e6:.2f} MB vs DRAM r+w {r.dram / 1e6:.2f} MB"
        )


def test_docs_table_is_current() -> None:
    text = DOC.read_text()
    assert BEGIN in text and END in text
    current = text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n")
    assert current == markdown(), (
        "docs/roofline-validation.md: run python tests/test_roofline_flops.py --write"
    )


# ------------------------------------------------------------------------------ the docs table


def _counter(names: tuple[str, ...]) -> str:
    return " + ".join(f"`{n}`" for n in names)


def _g(x: float) -> str:
    return f"{x:,.0f}" if x < 1e6 else f"{x:.4e}"


def markdown() -> str:
    """The docs table: one row per case."""
    out = [
        "| case | op | dtype (activations) | shape | kernel | analyzer FLOPs | counter (formula) | counter | "
        "executed / useful | the tiles give | target |",
        "|---|---|---|---|---|---:|---|---:|---:|---|---|",
    ]
    for r in rows():
        e = r.expect
        given = f"{e.ratio:.4f}" if e.ratio is not None else f"<= {e.at_most:.4f}"
        target = "within 5 %" if r.aligned else "reported"
        kernel = f"`{r.kernel[:40]}`" + ("" if e.tile in r.kernel else f" ({e.tile})")
        out.append(
            f"| {r.case} | `{r.op.removeprefix('aten::')}` | {r.dtype} | {r.shape} | {kernel} | "
            f"{_g(r.flops)} | {_counter(r.counters)} | {_g(r.executed)} | {r.ratio:.4f} | "
            f"{given}: {e.why} | {target} |"
        )
    return "\n".join(out)


def write_docs() -> None:
    text = DOC.read_text()
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    DOC.write_text(f"{head}{BEGIN}\n{markdown()}\n{END}{tail}")


if __name__ == "__main__":  # python tests/test_roofline_flops.py [--write]
    if "--write" in sys.argv[1:]:
        write_docs()
    else:
        print(markdown())
