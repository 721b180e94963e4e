"""A run of several inputs analysed input by input in worker processes, then joined.

Classification, phases and the roofline label each input from that input alone
(:func:`analyzer.pipeline.analyze_inputs`), so the workers that parse the rank traces of a run also
analyse them, on every CPU, and this process only joins the labelled kernels and runs what needs the
whole run (warnings over all inputs, findings, the summary). Contract: :func:`analyze_parts` gives
what ``analyze_trace(load_inputs(files), options, keep_host_ops=False)`` gives (a test compares
them), or None when it cannot, and the caller then takes that serial path:

* the files are too few or too small for worker processes (:func:`analyzer.runtime.pools.pool_jobs`),
  or a worker died;
* the inputs do not agree on what the roofline takes from the run as a whole: the GPU (taken from the
  first input) and the world size (the largest of any input).

Like the reader's workers, these take path strings and plain options and hand back Arrow IPC bytes
and JSON, nothing pickled from a trace.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections import Counter
from collections.abc import Sequence
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import pandas as pd

from analyzer.analyses import phases, roofline
from analyzer.errors import AnalyzerError, InputError
from analyzer.model import (
    ANNOTATION_SCHEMA,
    HOST_OP_SCHEMA,
    KERNEL_SCHEMA,
    InputMeta,
    Trace,
    ipc_bytes,
    ipc_table,
    unify,
    with_trace_id,
)
from analyzer.pipeline import (
    Analysis,
    Context,
    Options,
    analyze_inputs,
    as_context,
    resolve_context,
    start,
)
from analyzer.readers import expand_inputs
from analyzer.runtime import cache as cache_mod
from analyzer.runtime import pools as executor_mod
from analyzer.runtime.pools import ProgressFn


def analyze_parts(
    files: Sequence[str | os.PathLike[str]],
    options: Options | Context,
    *,
    jobs: int | None = None,
    cache: bool | str | os.PathLike[str] | None = False,
    executor: str = "local",
    scheduler: str | None = None,
    progress: ProgressFn | None = None,
) -> Analysis | None:
    """The run of ``files`` (directories expand to the traces inside) with every input analysed in a
    worker; None: take the serial path (one input, or see the module contract).

    The findings and the run's warnings are left to :func:`analyzer.pipeline.finish_run`.
    """
    executor_mod.check_settings(executor, jobs, scheduler)
    context = as_context(options)  # a bad --gpu, --model or rules file fails here, not in a worker
    paths = [str(f) for f in expand_inputs([str(f) for f in files])]
    if len(paths) < 2:
        return None
    plain = _plain_options(context.options)  # checked already: the context is resolved
    cache_dir = cache_mod.resolve_dir(cache)
    folder = str(cache_dir) if cache_dir is not None else None
    args = [(p, i, folder, plain) for i, p in enumerate(paths)]
    if executor == "dask":
        with executor_mod.dask_client(scheduler, jobs or executor_mod.default_jobs(len(paths))) as client:
            futures = [client.submit(analyze_part, *a, pure=False) for a in args]
            results = executor_mod.dask_gather(futures, paths, progress)
    else:
        n = executor_mod.pool_jobs(paths, jobs)
        if n < 2:
            return None
        try:
            results = executor_mod.pool_map(analyze_part, args, paths, n, progress)
        except BrokenProcessPool:
            return None  # a worker died (killed for memory?): the serial path reads one file at a time
    return join_parts(results, context)


def _plain_options(options: Options) -> dict[str, Any]:
    """``options`` as plain data for a worker; rule files as absolute paths."""
    plain = dataclasses.asdict(options)
    plain["rules"] = [str(Path(r).resolve()) for r in options.rules]
    plain["settings"] = dict(options.settings)
    return plain


# --------------------------------------------------------------------------- worker side


def analyze_part(path: str, index: int, cache_dir: str | None, options: dict[str, Any]) -> tuple[str, Any]:
    """Worker task: read ``path`` (through the cache) as input ``index`` of a run and analyse it.

    ``("part", {"kernels": IPC bytes, "annotations": IPC bytes, "meta": JSON})``, or
    ``("error", message)`` for bad input.
    """
    try:
        trace = with_trace_id(cache_mod.load_trace(path, Path(cache_dir) if cache_dir else None), index)
    except AnalyzerError as e:
        return "error", str(e)
    # the rule set and the other knowledge are cached: a forked worker resolves them from memory
    analysis = analyze_inputs(
        dataclasses.replace(start(trace), warnings=[]), resolve_context(Options(**options))
    )
    steps = analysis.steps if analysis.steps is not None else pd.DataFrame()
    meta = {
        "inputs": [m.to_dict() for m in trace.inputs],
        "reader_warnings": trace.warnings,
        "warnings": analysis.warnings,
        "steps": steps.to_dict("records"),
        "annotations_found": analysis.annotations_found,
        "gpu": analysis.gpu,
        "world_size": roofline.world_size(trace.inputs),
        "rules_sha256": analysis.rules_sha256,
        "layer_rules": analysis.layer_rules,
        "rule_groups": analysis.rule_groups,
        "work_sizes": analysis.work_sizes,
        "brief_facts": analysis.brief_facts,
    }
    return "part", {
        "kernels": ipc_bytes(analysis.kernels),
        "annotations": ipc_bytes(trace.annotations),
        "meta": json.dumps(meta),
    }


# --------------------------------------------------------------------------- joining


def join_parts(results: Sequence[tuple[str, Any]], context: Context) -> Analysis | None:
    """The run made of the analysed inputs, in order; None when they disagree on the GPU or world size."""
    for status, value in results:
        if status == "error":
            raise InputError(value)
    payloads = [value for _, value in results]
    metas = [json.loads(p["meta"]) for p in payloads]
    world = max(m["world_size"] for m in metas)
    if any(m["gpu"] != metas[0]["gpu"] or m["world_size"] != world for m in metas):
        return None
    parts = [ipc_table(p["kernels"]) for p in payloads]
    kernels = unify(parts, parts[0].schema)
    reader_warnings = [w for m in metas for w in m["reader_warnings"]]
    trace = Trace(
        kernels=kernels.select(KERNEL_SCHEMA.names),
        host_ops=HOST_OP_SCHEMA.empty_table(),
        annotations=unify([ipc_table(p["annotations"]) for p in payloads], ANNOTATION_SCHEMA),
        inputs=[InputMeta(**i) for m in metas for i in m["inputs"]],
        warnings=reader_warnings,
    )
    return Analysis(
        trace=trace,
        kernels=kernels,
        steps=pd.DataFrame([r for m in metas for r in m["steps"]], columns=phases.STEP_COLUMNS),
        gpu=metas[0]["gpu"],
        model=context.model,
        warnings=reader_warnings + [w for m in metas for w in m["warnings"]],
        annotations_found=sorted({e for m in metas for e in m["annotations_found"]}),
        rules_sha256=metas[0]["rules_sha256"],
        layer_rules=dict(sum((Counter(m["layer_rules"]) for m in metas), Counter())),
        # every rank reads the same registry: a group ran on the run where it ran on any rank
        rule_groups={g: any(m["rule_groups"][g] for m in metas) for g in metas[0]["rule_groups"]},
        work_sizes={k: v for m in metas for k, v in m.get("work_sizes", {}).items()},
        brief_facts={k: v for m in metas for k, v in m.get("brief_facts", {}).items()},
    )
