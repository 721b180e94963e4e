"""The roofline's entry point: the roofline columns of the kernels table, with the run's GPU.

Contract: :func:`measure` resolves the GPU (:mod:`~analyzer.analyses.roofline.gpu`), reads every
kernel's work (:func:`~analyzer.analyses.roofline.kernel_work.kernel_work`), rates it
(:func:`~analyzer.analyses.roofline.rates.rates`) and sets the :data:`COLUMNS` on the table.
Inputs measured apart agree with the joined run when they resolve to the same GPU and world size.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from analyzer.analyses.roofline.formulas import Tables
from analyzer.analyses.roofline.gpu import gpu_summary, resolve_gpu
from analyzer.analyses.roofline.kernel_work import kernel_work
from analyzer.analyses.roofline.rates import rates
from analyzer.knowledge import architectures, hardware
from analyzer.tables import launches
from analyzer.tables.dictionaries import DICT_STRING, dict_strings

COLUMNS = {
    "flops": pa.float64(),
    "bytes": pa.float64(),
    "flops_source": DICT_STRING,
    "uncounted": DICT_STRING,
    "achieved_tflops": pa.float64(),
    "achieved_tbps": pa.float64(),
    "pct_of_peak": pa.float64(),
    "intensity": pa.float64(),
    "bound": DICT_STRING,
    "roof_dtype": DICT_STRING,
}


@dataclasses.dataclass(frozen=True)
class Measured:
    """What :func:`measure` gives: the kernels with the roofline columns, the run's GPU, the sizes
    that counted kernels without shapes (per input) and the warnings of that (a ``--model`` that
    disagrees with the sizes the trace shows); per input whose shapes it looked at, the sizes they
    show (``found``: :class:`~analyzer.analyses.shape_roles.ModelDims` or None), so that no later
    step finds them again."""

    kernels: pa.Table
    gpu: dict[str, Any]
    sizes: dict[str, Any] = dataclasses.field(default_factory=dict)
    warnings: list[str] = dataclasses.field(default_factory=list)
    found: dict[int, Any] = dataclasses.field(default_factory=dict)


def measure(
    kernels: pa.Table,
    host_ops: pa.Table,
    inputs: Sequence[Any],
    gpu: tuple[hardware.GpuSpec, str] | None = None,
    model: architectures.ModelArch | None = None,
    gpu_table: Mapping[str, hardware.GpuSpec] | None = None,
    tables: Tables | None = None,
    join: launches.OpJoin | None = None,
) -> Measured:
    """Work, rates and bound of every kernel. ``gpu`` is the ``--gpu`` override and how it was
    named (None: detected from the first input, among ``gpu_table``, rules/hardware.toml's entries);
    ``model`` the ``--model`` architecture; ``tables`` the work tables (None: the built-in ones); ``join`` the kernel -> launching-op join
    (None: made here).
    Inputs measured apart agree with the joined run when they resolve to the same GPU and world size."""
    spec, reason = resolve_gpu(inputs, gpu, gpu_table)
    got = kernel_work(kernels, host_ops, model, world_size=world_size(inputs), tables=tables, join=join)
    cols = rates(kernels["dur_ns"].to_numpy(zero_copy_only=False), got.flops, got.bytes, got.dtype, spec)
    cols["flops_source"] = got.source
    cols["uncounted"] = got.uncounted
    k = kernels
    for name, typ in COLUMNS.items():
        arr = dict_strings(cols[name]) if typ == DICT_STRING else pa.array(cols[name], typ, from_pandas=True)
        k = (
            k.set_column(k.schema.get_field_index(name), name, arr)
            if name in k.column_names
            else k.append_column(name, arr)
        )
    return Measured(
        kernels=k, gpu=gpu_summary(spec, reason), sizes=got.sizes, warnings=got.warnings, found=got.found
    )


def world_size(inputs: Sequence[Any]) -> int:
    """The run's world size: collectives move data across this many ranks."""
    return max(m.world_size for m in inputs)
