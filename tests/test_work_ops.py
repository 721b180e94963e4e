"""The work tables (rules/work_ops.toml, the layouts of rules/attention_ops.toml): every entry's cases,
read by the roofline, give the FLOPs and bytes written beside them; the loaders reject bad entries;
each real-trace case is a call the named trace records (issue 32, item 1)."""

from __future__ import annotations

import functools
import gzip
import json
from pathlib import Path

import pytest

from analyzer.analyses import roofline
from analyzer.errors import InputError
from analyzer.knowledge.attention_ops import load_attention_ops
from analyzer.knowledge.work_ops import load_work_ops

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "traces"
WORK = load_work_ops()
ATTENTION = load_attention_ops()
TABLES = roofline.Tables(WORK, ATTENTION)


def _work_cases() -> list[tuple[str, str, dict]]:
    out = []
    for e in WORK.entries():
        for i, c in enumerate(e.cases):
            out.append((f"{e.id}-{i}", c.get("op") or getattr(e, "names", (e.id,))[0], c))
    return out


def _attention_cases() -> list[tuple[str, str, dict]]:
    seen: dict[str, object] = {}
    for lays in ATTENTION.by_name.values():
        for lay in lays:
            seen[lay.id] = lay
    for _, lay in ATTENTION.patterns:
        seen[lay.id] = lay
    return [(f"{lid}-{i}", c["op"], c) for lid, lay in seen.items() for i, c in enumerate(lay.cases)]


WORK_CASES = _work_cases()
ATTENTION_CASES = _attention_cases()


@pytest.mark.parametrize(("cid", "name", "case"), WORK_CASES, ids=[c[0] for c in WORK_CASES])
def test_every_work_case_gives_its_numbers(cid: str, name: str, case: dict) -> None:
    if "recorded" in case:  # a [[copy]] case: an activity's recorded bytes
        assert WORK.moved(case["name"]) * case["recorded"] == case["bytes"]
        return
    if "name" in case:  # a [[kernel_dtype]] case: the dtype a kernel name spells (none: no match)
        assert WORK.kernel_dtype(case["name"]) == case.get("dtype"), cid
        own = next(e for e in WORK.kernel_dtypes if e.id == name)
        assert bool(own.pattern.search(case["name"])) == ("dtype" in case), cid
        return
    got = roofline.read_op(name, case["dims"], case.get("types"), TABLES, consumer=case.get("consumer"))
    if "flops" not in case:  # an unsized op: no numbers
        assert got is None
        return
    assert got is not None, cid
    assert got.flops == pytest.approx(case["flops"], rel=1e-12) and got.bytes == pytest.approx(
        case["bytes"], rel=1e-12
    )
    if "roof" in case:  # the dtype whose compute peak bounds it
        assert got.dtype == case["roof"], cid


@pytest.mark.parametrize(("cid", "name", "case"), ATTENTION_CASES, ids=[c[0] for c in ATTENTION_CASES])
def test_every_attention_layout_case_gives_its_numbers(cid: str, name: str, case: dict) -> None:
    got = roofline.op_work(name, case["dims"], case.get("types"), TABLES)
    assert got is not None, cid
    assert got[0] == pytest.approx(case["flops"], rel=1e-9) and got[1] == pytest.approx(
        case["bytes"], rel=1e-9
    )


def _trace_path(trace: str) -> Path | None:
    """The file a case's ``trace`` names (its first word), None for a synthetic case."""
    word = trace.split(" ")[0]
    if word == "synthetic":
        return None
    base = (
        (ROOT / word).resolve() if not word.startswith("../shared") else SHARED / word.split("traces/", 1)[1]
    )
    files = sorted(base.glob("*.json.gz")) if base.is_dir() else [base]
    return files[0] if files else base


@functools.cache
def _recorded_calls(path: Path) -> dict[str, set[str]]:
    """Op name -> its recorded ``Input Dims``, as JSON text."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        events = json.load(f)["traceEvents"]
    out: dict[str, set[str]] = {}
    for e in events:
        if e.get("cat") == "cpu_op" and "Input Dims" in e.get("args", {}):
            out.setdefault(e["name"], set()).add(json.dumps(e["args"]["Input Dims"]))
    return out


REAL = [
    (cid, name, case)
    for cid, name, case in [*WORK_CASES, *ATTENTION_CASES]
    if "dims" in case and _trace_path(case["trace"]) is not None
]


@pytest.mark.parametrize(("cid", "name", "case"), REAL, ids=[c[0] for c in REAL])
def test_real_trace_cases_are_calls_the_trace_records(cid: str, name: str, case: dict) -> None:
    # GIVEN a case that names the real trace it was copied from
    path = _trace_path(case["trace"])
    if not path.exists():
        pytest.skip(f"{case['trace']}: not here (../shared/traces is absent)")
    calls = _recorded_calls(path)
    # THEN that trace records a call of the op with these shapes (the case may leave out trailing
    # scalar arguments)
    recorded = [json.loads(d) for d in calls.get(name, ())]
    want = case["dims"]
    assert any(d[: len(want)] == want and not any(d[len(want) :]) for d in recorded), f"{cid}: not in {path}"


@functools.cache
def _recorded_kernels(path: Path) -> set[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return {e["name"] for e in json.load(f)["traceEvents"] if e.get("cat") == "kernel"}


KERNEL_NAMES = [
    (f"{e.id}-{i}", c)
    for e in WORK.kernel_dtypes
    for i, c in enumerate(e.cases)
    if _trace_path(c["trace"]) is not None
]


@pytest.mark.parametrize(("cid", "case"), KERNEL_NAMES, ids=[c[0] for c in KERNEL_NAMES])
def test_real_kernel_dtype_cases_are_kernels_the_trace_records(cid: str, case: dict) -> None:
    # a [[kernel_dtype]] case copied from a trace: the trace runs a kernel of that name (a case may
    # keep the name's head only)
    names = _recorded_kernels(_trace_path(case["trace"]))
    assert any(n.startswith(case["name"].rstrip(">")) for n in names), f"{cid}: not in {case['trace']}"


def test_every_entry_has_a_real_case_or_says_it_is_synthetic() -> None:
    for e in WORK.entries():
        assert e.cases and all(c["trace"] for c in e.cases), e.id
    composed = [lay for lays in ATTENTION.by_name.values() for lay in lays if lay.composed]
    fused = [lay for lays in ATTENTION.by_name.values() for lay in lays if not lay.composed]
    assert composed and all(not lay.cases for lay in composed)
    assert all(lay.cases for lay in fused)


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ('[[gemm]]\nid = "WRK001"\nnames = ["x"]\na = 0\nb = 1\nm = "a[0]"\nk = "a[1]"\nn = "c[1]"\n'
         'note = "n"\nsource = "s"\ncases = [{dims = [[1]], trace = "synthetic"}]\n', "no dimension expression"),
        ('[[gemm]]\nid = "X1"\nnames = ["x"]\na = 0\nb = 1\nm = "a[0]"\nk = "a[1]"\nn = "b[1]"\n'
         'note = "n"\nsource = "s"\ncases = [{dims = [[1]], trace = "synthetic"}]\n', "WRK###"),
        ('[[gemm]]\nid = "WRK001"\nnames = ["x"]\na = 0\nb = 1\nm = "a[0]"\nk = "a[1]"\nn = "b[1]"\n'
         'note = "n"\nsource = "s"\ncases = []\n', "at least one case"),
        ('[[reduce]]\nid = "WRK001"\nnames = ["x"]\nnote = "n"\nsource = "s"\n'
         'cases = [{dims = [[1]], trace = "t"}]\n[[unsized]]\nid = "WRK002"\nnames = ["x"]\nnote = "n"\n'
         'source = "s"\ncases = [{dims = [[1]], trace = "t"}]\n', "already listed"),
        ('[[gather]]\nid = "WRK001"\nnames = ["x"]\ntable = 0\nselect = "consumer"\nindex = 1\nnote = "n"\n'
         'source = "s"\ncases = [{dims = [[1]], trace = "t"}]\n', "takes no index"),
        ('[[copy]]\nid = "WRK001"\npattern = "(a+)+"\nmoved = 2\nnote = "n"\nsource = "s"\n'
         'cases = [{name = "a", trace = "t"}]\n', "pattern rejected"),
        ('[[gemm]]\nid = "WRK001"\nnames = ["x"]\na = 0\nb = 1\nm = "a[0]"\nk = "a[1]"\nn = "b[1]"\n'
         'flops = 2\nnote = "n"\nsource = "s"\ncases = [{dims = [[1]], trace = "t"}]\n', "unknown key"),
        ('[[gemm]]\nid = "WRK001"\nnames = ["x"]\na = 0\nb = 1\nm = "a[0]"\nk = "a[1]"\nn = "b[1]"\n'
         'peak = "int4"\nnote = "n"\nsource = "s"\ncases = [{dims = [[1]], trace = "t"}]\n', "peak must be"),
        ('[[kernel_dtype]]\nid = "WRK001"\npattern = "qq"\ndtype = "fp9"\nnote = "n"\nsource = "s"\n'
         'cases = [{name = "a", trace = "t"}]\n', "dtype must be"),
        ('[[kernel_dtype]]\nid = "WRK001"\npattern = "(a+)+"\ndtype = "fp8"\nnote = "n"\nsource = "s"\n'
         'cases = [{name = "a", trace = "t"}]\n', "pattern rejected"),
    ],
)  # fmt: skip
def test_bad_work_tables_name_file_and_entry(tmp_path: Path, body: str, needle: str) -> None:
    f = tmp_path / "work.toml"
    f.write_text(body)
    with pytest.raises(InputError, match=needle):
        load_work_ops(f)


def test_bad_attention_layouts_name_the_entry(tmp_path: Path) -> None:
    f = tmp_path / "a.toml"
    f.write_text('[[op]]\nid = "x"\nnote = "n"\nnames = ["o"]\nquery = 0\nrank = 4\nq_dim = 1\n')
    with pytest.raises(InputError, match="needs cases"):
        load_attention_ops(f)
    one = (
        '[[op]]\nid = "{id}"\nnote = "n"\nnames = ["o"]\nquery = 0\nrank = 4\nq_dim = 1\n'
        'cases = [{{dims = [[1]], op = "o", trace = "synthetic"}}]\n'
    )
    f.write_text(one.format(id="a") + one.format(id="b"))
    with pytest.raises(InputError, match="same rank and packing"):
        load_attention_ops(f)


def test_one_op_name_heads_a_dense_and_a_packed_layout() -> None:
    # GIVEN _flash_attention_forward recorded dense (B, L, H, E) and packed (T, H, E) + cu_seqlens
    dense = [[2, 48, 4, 32], [2, 48, 2, 32], [2, 48, 2, 32], [], []]
    packed = [[96, 4, 32], [96, 2, 32], [96, 2, 32], [3], [3]]
    # THEN each is read by its own entry, and a packed call without its cu_seqlens by none
    assert ATTENTION.layout("aten::_flash_attention_forward", dense).id == "flash-blhd"
    assert ATTENTION.layout("aten::_flash_attention_forward", packed).id == "flash-varlen-thd"
    assert (
        ATTENTION.layout("aten::_flash_attention_forward", [[96, 4, 32], [96, 2, 32], [96, 2, 32], [], []])
        is None
    )
    # the step labels do not read the layouts kept for the roofline only
    assert ATTENTION.layout("aiter::mha_batch_prefill") is not None
    assert ATTENTION.for_steps().layout("aiter::mha_batch_prefill") is None


def test_causal_convention_counts_the_pairs_the_mask_keeps() -> None:
    # a whole prompt: half the score matrix with its diagonal; decode: every key; a chunk of 4
    # queries after 6 cached keys: 4 x 6 + 4 x 5 / 2
    assert roofline.causal_pairs(48, 48) == 48 * 49 / 2
    assert roofline.causal_pairs(1, 53) == 53
    assert roofline.causal_pairs(4, 10) == 4 * 6 + 10
    # the same convention for attention composed of matmuls: the score product of a prompt of 48
    # (q x d) @ (d x kv) and the weighted values (q x kv) @ (kv x d) keep 49 / 96 of their products
    score = WORK.gemm("aten::bmm", [[8, 48, 32], [8, 32, 48]])
    values = WORK.gemm("aten::bmm", [[8, 48, 48], [8, 48, 32]])
    assert roofline.composed_causal_share(score) == roofline.composed_causal_share(values) == 49 / 96
    assert roofline.composed_causal_share(WORK.gemm("aten::bmm", [[8, 1, 32], [8, 32, 53]])) == 1.0


def test_gemm_dimensions_have_one_reading() -> None:
    # the roles from shapes (layers), the LM head's rows (phases) and the roofline read one table
    from analyzer.analyses.phases.evidence import WORK_OPS as LM_HEAD_OPS
    from analyzer.analyses.walk.positions import gemm_shape

    assert gemm_shape("aten::addmm", [[128], [2, 512], [512, 128], [], []]) == (512, 128)
    assert gemm_shape("aten::_weight_int4pack_mm", [[8, 4096], [1792, 32, 32, 4], [], [32, 14336, 2]]) == (
        4096,
        14336,
    )
    # a grouped product's weights are experts: no dense role
    assert gemm_shape("aten::_grouped_mm", [[16384, 2048], [128, 2048, 1536], [128], [], []]) is None
    assert LM_HEAD_OPS.rows("aten::linear", [[4, 512, 4096], [128256, 4096], []]) == 2048
