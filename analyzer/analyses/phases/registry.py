"""The phase rules' ids and thresholds (``rules/structure.toml``) and the per-kernel evidence codes.

Contract: constants only, read once at import. Every rule the steps and phases decide by is named
here (``_ID("...")``: a KeyError at import for a name the registry lacks), so the other modules of
the package record the ids they take from here and look none up themselves.
"""

from __future__ import annotations

from analyzer.knowledge.structure_rules import Thresholds, load_structure
from analyzer.knowledge.taxonomy import ALL_GEMM_STAGES, ATTENTION_KERNEL_STAGES

# the GEMM and attention kernels: their run time says how much work a step did
HEAVY_STAGES = ALL_GEMM_STAGES + ATTENTION_KERNEL_STAGES
# the registry (rules/structure.toml): the phase rules' ids and the default thresholds
KNOWLEDGE = load_structure()
DEFAULT_THRESHOLDS: Thresholds = KNOWLEDGE.thresholds
# how many times longer a step's typical heavy kernel must be than in the run's lightest steps
PREFILL_WORK_RATIO = DEFAULT_THRESHOLDS.prefill_work_ratio
# an idle gap this many times the median inter-kernel gap (and >= 200 us) cuts a step when there
# is no forward structure at all
GAP_FACTOR = DEFAULT_THRESHOLDS.gap_factor
MIN_GAP_NS = DEFAULT_THRESHOLDS.min_gap_ns
_ID = KNOWLEDGE.id_of
ANNOTATION_STEPS = _ID("annotation-steps")
MERGE_NESTED = _ID("merge-nested")
FORWARD_STARTS = _ID("forward-starts")
GRAPH_LAUNCH_START = _ID("graph-launch-start")
FORWARD_PROLOGUE = _ID("forward-prologue")
# the structure rule whose kernels open the forward after them (STR062, the next forward's inputs)
PROLOGUE_RULE = _ID("next-forward-prologue")
HEAVY_PREFIX = _ID("heavy-prefix-step")
LOOKUP_IN_LAYERS = _ID("lookup-in-layers")
GAP_STEPS = _ID("gap-steps")
SHAPE_ONE_TOKEN = _ID("shape-one-token")
SHAPE_VERIFY = _ID("shape-verify")
SHAPE_PREFILL = _ID("shape-prefill")
RECOMPUTED_PREFIX = _ID("recomputed-prefix")
PACKED_STEP = _ID("packed-step")
PACKED_PHASE = _ID("packed-phase")
PACKED_BOOKKEEPING = _ID("packed-bookkeeping")
SCORED_UNKNOWN = _ID("scored-unknown")
SIGNATURE_WORK = _ID("signature-work")
SIGNATURE_NOVEL = _ID("signature-novel-names")
SIGNATURE_KERNELS = _ID("signature-more-kernels")
SINGLE_STEP = _ID("single-step-unknown")
SIGNATURE_ALL_HEAVY = _ID("signature-all-heavy")
PADDED_OR_REPLAYED = _ID("padded-or-replayed")
UNSHAPED_PREFILL_RUN = _ID("unshaped-prefill-run")
SIGNATURE_BY_MODEL = _ID("signature-by-model")
MODELS_BY_SHAPE = _ID("models-by-shape")
MODELS_BY_DEPTH = _ID("models-by-depth")
VERIFY_WIDTH = _ID("verify-width")
STATIC_BATCH = _ID("static-batch-decode")
KERNEL_EVIDENCE = _ID("kernel-phase-evidence")
TRAINING_RUN = _ID("training-run")
NO_LLM_STRUCTURE = _ID("no-llm-structure")
EVIDENCE_CONFLICT = _ID("evidence-conflict")
GRID_QUERY_TILES = _ID("grid-query-tiles")
GRID_SEQUENCES = _ID("grid-decode-sequences")
M_REGIME = _ID("gemm-m-regime")
FRESH_CONTEXT = _ID("no-cached-keys")
NORM_ROWS = _ID("norm-row-tokens")
# per kernel: the phase its family's rule says engines run it in (rules/kernels.toml `phases`), or
# prefill by its launch grid (a query longer than one tile, PHS030)
NO_EVIDENCE, DECODE_EVIDENCE, PREFILL_EVIDENCE, PREFILL_GRID_EVIDENCE = 0, 1, 2, 3
# per kernel: the M regime of a GEMM whose rule states its token tile (PHS032)
NO_REGIME, SKINNY, LARGE, BETWEEN = 0, 1, 2, 3
