"""The analyzer's FLOPs against an independent count (issue 32, item 4a; docs/roofline-validation.md).

GIVEN a zoo case (captured on an H200) and the same workload rerun on the CPU under PyTorch's own
FLOP counter (``tests/flop_reference.py``: no code or table of the analyzer's roofline), WHEN the
analyzer reads the trace, THEN every matrix product and attention call it counts from shapes is
within 1 % of the counter's, op by op where both sides ran the same ops (else the step's total),
and the kernels it counts from sizes found in the trace are within 1 % of the forward's products.
A subset of the zoo runs here (one case per layout); ``python benchmarks/accuracy.py --flops`` runs
every case and writes the table of docs/roofline-validation.md.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the independent count reruns the case with torch (CPU)")
pytest.importorskip("transformers", reason="the zoo's models are transformers models")

from tests import flop_reference  # noqa: E402

ZOO = Path(__file__).resolve().parents[1] / "fixtures" / "zoo"
TOLERANCE = 0.01
# one case per layout: (case, the analyzer rules its counted ops must include)
SUBSET = {
    "llama-sdpa-flash-fp16": {"flash-blhd", "WRK001"},  # the FlashAttention layout (B, L, H, E)
    "llama-mha-sdpa-efficient-bf16": {"flash-blhd"},  # memory-efficient attention, same layout
    "llama-eager-bf16": {"WRK003"},  # attention composed of matmuls: the causal convention
    "qwen3-moe-grouped-bf16": {"sdpa-bhld"},  # grouped_mm experts (prefill; decode runs bmm)
    "qwen2-moe-bmm-bf16": {"WRK003"},  # per-token expert weights x bmm
    "llama-static-cache-bf16": set(),  # CUDA-graph decode: products from the sizes found
}


@pytest.mark.parametrize("case", sorted(SUBSET))
def test_analyzer_flops_match_pytorchs_counter(case: str) -> None:
    if not (ZOO / case / "trace.json.gz").exists():
        pytest.skip(f"zoo case {case} absent")
    got = flop_reference.compare(ZOO / case)
    assert got.ops or got.totals, "nothing compared"
    bad = [x for x in [*got.ops, *got.totals] if x[3] > 0 and abs(x[4] - x[3]) / x[3] > TOLERANCE]
    assert not bad, bad[:5]
    assert SUBSET[case] <= {rule for *_, rule, _, _ in got.ops}
    if case == "llama-static-cache-bf16":
        # the decode steps replay a CUDA graph: their products are counted from the found sizes
        assert {basis for _, _, basis, _, _ in got.totals} == {"found"}
    else:
        assert not got.uncounted, got.uncounted[:3]


def test_cases_that_cannot_be_rerun_say_why() -> None:
    assert flop_reference.why_not({"assistant": {"x": 1}}).startswith("assisted generation")
    assert flop_reference.why_not({"mode": "continuous-batching"}).startswith("continuous batching")
    assert flop_reference.why_not({"mode": "generate", "attn": "sdpa"}) is None
