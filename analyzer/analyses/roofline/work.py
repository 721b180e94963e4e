"""What the roofline says of each kernel's work: the per-kernel arrays and their vocabularies.

Contract: :class:`Work` holds, per kernel, FLOPs and bytes (NaN when unknown), their basis
(:data:`FLOPS_SOURCES`), the dtype of the roof and, where there are no numbers, why
(:data:`UNCOUNTED`). While the numbers are read, each kernel carries an int8 code of
:data:`REASONS` (:data:`REASON_CODE`): nothing yet, "has a launching op", or an ``UNCOUNTED`` reason.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

#: the basis of a kernel's numbers: recorded shapes, sizes found in the trace, ``--model``, none
FLOPS_SOURCES = ("shapes", "found", "model", "none")
#: why a kernel has no numbers (the ``uncounted`` column; null where it has them)
UNCOUNTED = {
    "helper": "a helper kernel of an op whose work is counted on the op's longest kernel",
    "no_formula": "its launching op's shapes are recorded, but no table says what work that op does",
    "output_unknown": "a gather / scatter / selection whose output size the recorded shapes do not give",
    "shapes_unreadable": "its launching op is in a work table, but the recorded shapes do not fit its layout",
    "no_shapes": "no recorded shapes for its launch (shapes off, CUDA-graph replay, compiled region) and no sizes count its stage",
    "no_sizes": "a GEMM-role or MoE-expert kernel without shapes: no sizes were found in the trace; --model would count it",
    "no_tokens": "a GEMM-role or MoE-expert kernel without shapes in a step whose token count is unknown (an LM head outside decode: the rows it scores are unknown)",
    "not_work": "not work: a barrier packet, or a copy without a recorded size",
}
# what a kernel's launch said about its numbers while they were read (int8 codes per kernel): nothing
# yet, "has a launching op", or an UNCOUNTED reason
REASONS = ("", "op", *UNCOUNTED)
REASON_CODE = {r: np.int8(i) for i, r in enumerate(REASONS)}


@dataclasses.dataclass
class Work:
    """Per kernel: flops, bytes (NaN when unknown), flops_source, dtype of the roof and, where no
    numbers, why (:data:`UNCOUNTED`); the sizes that counted kernels without shapes, and warnings."""

    flops: np.ndarray
    bytes: np.ndarray
    source: np.ndarray  # object (str)
    dtype: np.ndarray  # object (str)
    uncounted: Any  # a dictionary array (null where counted), or a sequence of str / None
    sizes: dict[str, Any] = dataclasses.field(default_factory=dict)
    warnings: list[str] = dataclasses.field(default_factory=list)
    # per input whose shapes were looked at for sizes: what they showed (ModelDims, None: nothing)
    found: dict[int, Any] = dataclasses.field(default_factory=dict)

    def __iter__(self) -> Any:  # (flops, bytes, source, dtype), as kernel_work returned before
        return iter((self.flops, self.bytes, self.source, self.dtype))
