"""PHS035 (analyzer/analyses/phases/shapes.py, recomputed_prefix): generation without a KV cache re-runs the
whole sequence each step; those steps are decodes, on synthetic step shapes and on swept traces."""

from __future__ import annotations

import lzma
import shutil
from pathlib import Path

import pytest

from analyzer.analyses.phases import RECOMPUTED_PREFIX, SHAPE_PREFILL, recomputed_prefix

ROOT = Path(__file__).resolve().parents[1]
SWEEP = ROOT / "fixtures" / "sweep"


def _run(hits):
    n = len(hits)
    phases = ["prefill"] * n
    rules = [SHAPE_PREFILL] * n
    evidence = [[] for _ in range(n)]
    got = recomputed_prefix(hits, [False] * n, phases, rules, evidence)
    return phases, rules, got


def test_steps_that_rerun_the_sequence_with_one_token_more_are_decodes() -> None:
    # GIVEN (batch, query, keys, model) of three steps: 16, 17, 18 tokens a sequence, no cache
    phases, rules, got = _run([(2, 16, 16, (64, 64)), (2, 17, 17, (64, 64)), (2, 18, 18, (64, 64))])
    assert phases == ["prefill", "decode", "decode"] and got == [1, 2] and rules[1] == RECOMPUTED_PREFIX


@pytest.mark.parametrize(
    "hits",
    [
        [(2, 16, 16, (64, 64)), (2, 32, 32, (64, 64))],  # a longer prompt: another prefill
        [(2, 16, 16, (64, 64)), (4, 17, 17, (64, 64))],  # another batch
        [(2, 16, 16, (64, 64)), (2, 17, 33, (64, 64))],  # a chunk over cached keys
        [(2, 16, 16, (64, 64)), (2, 17, 17, (32, 32))],  # another model (a draft)
    ],
)
def test_other_prefill_runs_stay_prefills(hits) -> None:
    phases, _, got = _run(hits)
    assert got == [] and set(phases) == {"prefill"}


@pytest.mark.parametrize("model_type", ["mpt", "openai-gpt"])
def test_swept_models_without_a_cache_get_their_decode_steps(model_type: str, tmp_path: Path) -> None:
    from analyzer.cli.check_cmd import check_trace

    path = tmp_path / "trace.json"
    with lzma.open(SWEEP / model_type / "trace.json.xz", "rb") as f, open(path, "wb") as g:
        shutil.copyfileobj(f, g, 1 << 20)
    r = check_trace(str(path))
    # THEN every step's phase and token counts agree with the engine's own (they were 33% before)
    assert r["steps"]["fields"]["phase"]["wrong"] == 0
    assert r["steps"]["fields"]["decode_tokens"]["wrong"] == 0
    assert r["phase"]["decided_agreement"] >= 0.99
