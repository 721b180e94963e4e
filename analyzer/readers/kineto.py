"""PyTorch profiler (Kineto) Chrome-trace JSON, plain or gzip, CUDA and ROCm builds -> Trace.

Contract: every ``ph == "X"`` event of category ``kernel``, ``gpu_memcpy`` or ``gpu_memset`` becomes one
row of ``kernels`` (times in absolute int64 ns, device ids 0-based, ROCm work-item grids converted to
blocks); ``cpu_op``, ``cuda_runtime`` and ``cuda_driver`` events become ``host_ops``; ``user_annotation``
and ``gpu_user_annotation`` events become ``annotations``. Nothing else is kept.

The file is never decoded whole: the ``traceEvents`` array is cut into chunks at event boundaries and
each chunk is decoded by a typed msgspec decoder that skips every field we do not need
(:mod:`analyzer.readers.kineto_scan`), then turned into Arrow columns before the next chunk is read
(:mod:`analyzer.readers.kineto_events`). Peak memory is one chunk plus the columnar tables. This
module sniffs and reads the file and turns those columns into the model: host ops, kernels in time
order with their launch calls, and the input's metadata.
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from analyzer import readers
from analyzer.errors import InputError
from analyzer.model import (
    ANNOTATION_SCHEMA,
    HOST_OP_SCHEMA,
    KERNEL_SCHEMA,
    InputMeta,
    Trace,
    table_from_columns,
)
from analyzer.readers import gz
from analyzer.readers.kineto_events import EventValueError, TableBuilder
from analyzer.readers.kineto_scan import stream_events, top_level
from analyzer.readers.policy import ReadPolicy
from analyzer.tables import lookup
from analyzer.tables.dictionaries import dict_isin, dict_take
from analyzer.tables.launches import launch_calls

FORMAT = "kineto"
READER_VERSION = "7"
STREAMS = True  # read() takes a progress callback
TAKES_POLICY = True  # read() takes a ReadPolicy (analyzer.readers.read_trace passes it on)

_GRAPH_LAUNCH = re.compile(r"^(cuda|hip)GraphLaunch|^cuGraphLaunch")
# hipExtModuleLaunchKernel records globalWorkSize (work-items) as "grid" (README.md, "Inputs").
_WORKITEM_LAUNCH = "hipExtModuleLaunchKernel"
_DIMS = msgspec.json.Decoder(list[list[int]])
_TYPES = msgspec.json.Decoder(list[str])


def sniff(path: Path, head: bytes) -> bool:
    """A JSON object with a ``traceEvents`` key, or a bare event list (old HTA files)."""
    h = head.lstrip()
    if b'"BeginNs"' in head:  # rocprof v1 results.json: Chrome trace written by rocprof, not Kineto
        return False
    if h[:1] == b"{":
        return b'"traceEvents"' in head or (
            b'"schemaVersion"' in head and b"rocprofiler-sdk-tool" not in head
        )
    return h[:1] == b"[" and (b'"ph"' in head and b'"cat"' in head)


def read(
    path: Path, progress: Callable[[int], None] | None = None, policy: ReadPolicy | None = None
) -> Trace:
    """Read one Kineto trace; ``progress`` is called with the bytes read so far.

    ``policy`` (:class:`analyzer.readers.policy.ReadPolicy`) may parse the events elsewhere and defer
    the file's sha256; then ``meta.sha256`` stays empty until that hash is done (see
    :func:`analyzer.runtime.cache.load_trace`). Without one the file is read here, chunk by chunk."""
    policy = policy or ReadPolicy()
    with policy.scope() if policy.scope is not None else contextlib.nullcontext():
        builder = _parallel_read(path, progress, policy)
        if builder is None:
            builder = TableBuilder()
            try:
                meta_obj = stream_events(path, builder.add, progress)
            except EventValueError as e:
                raise InputError(f"{path}: {e}") from None
        else:
            meta_obj = builder.meta
    meta = _input_meta(path, meta_obj, any(_uses_hip(h) for h in builder.host))
    meta.sha256 = readers.memo_sha256(path) or (
        "" if policy.defer_hash is not None else readers.file_sha256(path)
    )
    if not meta.sha256 and policy.defer_hash is not None:
        # left to a thread: started now, beside the post-processing (mostly Arrow kernels, outside
        # the GIL), it is done before the analysis ends and the cache entry that waits for it is
        # written in time (whoever asks for the digest meanwhile waits for it)
        policy.defer_hash(_hash_ahead, path)
    kernels, host_ops, annotations, warnings = _post_process(builder, meta, meta_obj)
    if kernels.num_rows == 0:
        raise InputError(f"{path}: no GPU activity recorded (no kernel, memcpy or memset events)")
    return Trace(kernels, host_ops, annotations, [meta], warnings)


def _hash_ahead(path: Path) -> None:
    with contextlib.suppress(OSError):  # whoever needs the digest hashes again and reports it
        readers.file_sha256(path)


def _parallel_read(
    path: Path, progress: Callable[[int], None] | None, policy: ReadPolicy
) -> TableBuilder | None:
    """The tables of a big trace parsed by the policy's workers; None when it is read here instead."""
    if policy.parallel_events is None:
        return None
    with open(path, "rb") as f:
        gzipped = f.read(2) == gz.MAGIC
    builder = TableBuilder()
    got = policy.parallel_events(path, gzipped, builder.add_tables, progress)
    if got is None:
        return None  # read sequentially: same tables, or the precise error
    prefix, tail, sha = got
    if sha:
        readers.remember_sha256(path, sha)
    builder.meta = top_level(path, prefix, tail)
    return builder


def _parse_dims(d: bytes | None) -> list[list[int]] | None:
    if d is None:
        return None
    try:
        return _DIMS.decode(d)  # the common case, validated in C
    except msgspec.ValidationError:
        return _clean_dims(orjson.loads(d))  # TensorList entries, odd values
    except msgspec.DecodeError:
        return None


def _parse_types(t: bytes | None) -> list[str] | None:
    if t is None:
        return None
    try:
        return _TYPES.decode(t)
    except msgspec.ValidationError:
        return _clean_types(orjson.loads(t))
    except msgspec.DecodeError:
        return None


def _clean_dims(d: Any) -> list[list[int]] | None:
    """Input Dims as list of int lists; TensorList entries (lists of lists) become their first."""
    if not isinstance(d, list):
        return None
    out = []
    for x in d:
        if isinstance(x, list) and all(type(v) is int for v in x):
            out.append(x)
        elif isinstance(x, list) and x and isinstance(x[0], list):
            first = x[0]
            out.append(first if all(type(v) is int for v in first) else [])
        else:
            out.append([])
    return out


def _clean_types(t: Any) -> list[str] | None:
    if not isinstance(t, list):
        return None
    return [x if isinstance(x, str) else str(x) for x in t]


# --------------------------------------------------------------------------- columns -> model


def _post_process(
    builder: TableBuilder, meta: InputMeta, meta_obj: dict[str, Any]
) -> tuple[pa.Table, pa.Table, pa.Table, list[str]]:
    """Canonical tables from the builder's chunk tables, which it consumes.

    Memory is the point here: a big trace yields about as many bytes of chunk tables as of
    canonical ones (docs/performance.md). Host chunks are converted one at a time and dropped; kernel columns are built one at a
    time, each taken in time order directly (no second copy of the table for the sort).
    """
    base = _base_ns(meta_obj)
    rank = meta.rank
    _record_session(meta, builder.host, base)
    ext = [c.cast(pa.int64()) for t in builder.kernels for c in t["external_id"].chunks]
    wanted = lookup.unique(pa.chunked_array(ext, pa.int64())) if ext else None
    host = _host_ops(builder.host, wanted, base, rank)
    ann = _annotations(builder.ann, base, rank)
    kernels = _kernels(builder.kernels, host, base, rank, meta)
    return kernels, host, ann, []


def _record_session(meta: InputMeta, host: list[pa.Table], base: int) -> None:
    """Which profiling session wrote this file (inputs of one rank join only within one, README.md "Commands"):
    the process that launched the GPU work, the clock base of its timestamps and Kineto's id of the
    profiler session (``trace_id``, kept by tools that split one profile into files)."""
    pids: set[int] = set()
    for t in host:
        if "pid" in t.column_names:
            pids.update(int(p) for p in pc.unique(t["pid"]).to_pylist() if p is not None)
    if len(pids) == 1:
        meta.extra["pid"] = pids.pop()
    if base:
        meta.extra["clock_base_ns"] = base


#: cpu_ops kept although no GPU activity names them: they launch through ops nested in them and say
#: what those ops do (``F.embedding`` dispatches to ``aten::index_select`` / ``aten::gather``; the
#: SDPA front end's copies and mask work run inside it; ``Tensor.repeat``'s copy is a module's own,
#: rules/structure.toml ``module_copy_ops``)
CONTEXT_OPS = ("aten::embedding", "aten::embedding_bag", "aten::scaled_dot_product_attention", "aten::repeat")


def _host_ops(parts: list[pa.Table], wanted: pa.Array | None, base: int, rank: int) -> pa.Table:
    """Launch calls, the cpu_ops some GPU activity names (``wanted`` external ids) and the
    :data:`CONTEXT_OPS`; the rest is never used. Consumes ``parts``: each chunk is freed once converted."""
    if not parts:
        return HOST_OP_SCHEMA.empty_table()
    # one dictionary per column across chunks: shape codes, hence shape ids, are global
    whole = pa.concat_tables(parts, promote_options="default").unify_dictionaries()
    parts.clear()
    if whole.num_rows == 0:
        return HOST_OP_SCHEMA.empty_table()
    shapes = [
        _decoded_dictionary(whole["dims_raw"], _parse_dims, pa.list_(pa.list_(pa.int64()))),
        _decoded_dictionary(whole["types_raw"], _parse_types, pa.list_(pa.string())),
    ]
    batches = whole.to_batches()
    del whole
    batches.reverse()
    out: list[pa.Table] = []
    while batches:
        b = batches.pop()
        keep = ~dict_isin(b["category"], ["cpu_op"]) | dict_isin(b["name"], CONTEXT_OPS)
        if wanted is not None:
            keep |= lookup.isin(b["external_id"], wanted)
        b = b.filter(pa.array(keep))
        del keep
        nh = b.num_rows
        if nh == 0:
            continue
        linked = dict_isin(b["category"], ["cpu_op"])
        codes = []
        cols: dict[str, Any] = {}
        for values, key, raw in zip(
            shapes, ("input_dims", "input_types"), ("dims_raw", "types_raw"), strict=True
        ):
            c = _codes(b[raw], linked)
            codes.append(c)
            cols[key] = values.take(pa.array(np.where(c < 0, len(values) - 1, c)))
        shape_id = np.where(linked, (codes[0] + 1) * (1 << 31) + (codes[1] + 1), -1)
        cols.update(
            {
                "trace_id": np.zeros(nh, np.int16),
                "rank": np.full(nh, rank, np.int16),
                "name": b["name"],
                "start_ns": _shift(b["ts"], base),
                "dur_ns": _fill0(b["dur"]),
                "external_id": b["external_id"],
                "shape_id": pa.array(shape_id, mask=shape_id < 0),
                "category": b["category"],
                "tid": b["tid"],
                "correlation": b["correlation"],
            }
        )
        del b
        out.append(table_from_columns(cols, HOST_OP_SCHEMA))
    return pa.concat_tables(out) if out else HOST_OP_SCHEMA.empty_table()


def _decoded_dictionary(col: pa.ChunkedArray, parse: Callable[[Any], Any], typ: pa.DataType) -> pa.Array:
    """The parsed values of a (unified) dictionary column, each decoded once, plus a trailing null."""
    raw = [] if col.num_chunks == 0 else col.chunk(0).dictionary.to_pylist()
    return pa.array([parse(v) for v in raw] + [None], typ)


def _codes(col: pa.Array, wanted: np.ndarray) -> np.ndarray:
    """Dictionary codes as int64, -1 for nulls and rows not ``wanted``."""
    codes = pc.fill_null(col.indices, -1).to_numpy(zero_copy_only=False).astype(np.int64)
    codes[~wanted] = -1
    return codes


def _annotations(parts: list[pa.Table], base: int, rank: int) -> pa.Table:
    a = pa.concat_tables(parts, promote_options="default").unify_dictionaries() if parts else None
    parts.clear()
    if a is None or a.num_rows == 0:
        return ANNOTATION_SCHEMA.empty_table()
    start = _shift(a["ts"], base)
    dur = _fill0(a["dur"]).to_numpy(zero_copy_only=False)
    return table_from_columns(
        {
            "trace_id": np.zeros(a.num_rows, np.int16),
            "rank": np.full(a.num_rows, rank, np.int16),
            "name": a["name"].cast(pa.string()),
            "start_ns": start,
            "end_ns": pa.array(start.to_numpy(zero_copy_only=False) + dur),
            "side": a["side"].cast(pa.string()),
        },
        ANNOTATION_SCHEMA,
    )


def _kernels(parts: list[pa.Table], host: pa.Table, base: int, rank: int, meta: InputMeta) -> pa.Table:
    """The kernels table in time order. Consumes ``parts``."""
    if not parts:
        return KERNEL_SCHEMA.empty_table()
    k = pa.concat_tables(parts, promote_options="default").unify_dictionaries()
    parts.clear()
    n = k.num_rows
    if n == 0:
        return KERNEL_SCHEMA.empty_table()
    if k["ts"].null_count or k["dur"].null_count:
        raise InputError(f"{meta.path}: GPU event without ts or dur")
    if pc.any(pc.less(k["dur"], 0)).as_py():
        raise InputError(f"{meta.path}: GPU event with negative duration")
    for col in ("grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z"):
        if col in k.column_names and pc.any(pc.less(k[col], 0)).as_py():
            low = pc.min(k[col]).as_py()
            raise InputError(f"{meta.path}: GPU event with negative {col.replace('_', ' ')} ({low})")
    # launch linkage via correlation (first: its lookup's temporaries are the read's largest)
    launch_api, graph = _launch_info(k, host)
    devcol = _devices(k, bool(meta.extra.get("rocm")))
    start = _shift(k["ts"], base)
    order = pc.sort_indices(start)  # stable: ties keep file order
    cols: dict[str, Any] = {
        "trace_id": lambda: np.zeros(n, np.int16),
        "rank": lambda: np.full(n, rank, np.int16),
        "name": lambda: k["name"],
        "norm_name": lambda: k["name"],
        "kind": lambda: k["cat"].cast(pa.string()),
        "start_ns": lambda: start,
        "dur_ns": lambda: k["dur"],
        "device": lambda: pa.array(devcol),
        "stream": lambda: k["stream"] if k["stream"].null_count < n else k["tid"],
        "correlation": lambda: k["correlation"],
        "launch_op_id": lambda: k["external_id"],
        "graph_launch": lambda: graph,
        "count": lambda: np.ones(n, np.int64),
        "aggregate": lambda: np.zeros(n, bool),
        "registers": lambda: k["registers"],
        "shared_mem": lambda: k["shared_mem"],
        "bytes_recorded": lambda: k["bytes"],
        "launch_api": lambda: launch_api,
    }
    workitems = None
    if meta.extra.get("rocm"):
        wi = pc.fill_null(pc.equal(launch_api, _WORKITEM_LAUNCH), False).to_numpy(zero_copy_only=False)
        workitems = wi if wi.any() else None
    for ax in "xyz":
        cols[f"grid_{ax}"] = functools.partial(lambda ax: _grid(k, ax, workitems), ax)
        cols[f"block_{ax}"] = functools.partial(lambda ax: _to_int32(_np(k[f"block_{ax}"])), ax)
    # the workers' columns are let go as soon as the last column built from them is: the chunk
    # tables and the kernels table are then never both whole in memory
    k = k.select([c for c in k.column_names if c in _RAW_LAST_READ])
    arrays = []
    for f in KERNEL_SCHEMA:
        if f.name == "norm_name":  # the names as read: one array for both columns
            cols.pop(f.name)
            arrays.append(arrays[KERNEL_SCHEMA.get_field_index("name")])
            continue
        one = table_from_columns({f.name: cols.pop(f.name)()}, pa.schema([f]))
        arrays.append(one.column(0).take(order))
        del one
        done = [c for c in k.column_names if _RAW_LAST_READ[c] == f.name]
        if done:
            k = k.drop_columns(done)
    return pa.Table.from_arrays(arrays, schema=KERNEL_SCHEMA)


def _devices(k: pa.Table, rocm: bool) -> np.ndarray:
    """Device ids as int16: CUDA writes 0-based ids; ROCm writes HSA node ids (2, 5, 9 ...),
    ranked here."""
    dev_raw = _np(k["device"]) if k["device"].null_count == 0 else None
    if dev_raw is None:
        pid = k["pid"].to_pandas()
        devcol = k["device"].to_pandas().fillna(pid).fillna(0).astype("int64").to_numpy()
    else:
        devcol = dev_raw.astype(np.int64)
    if rocm:
        devcol = np.searchsorted(lookup.unique(devcol), devcol)
    return devcol.astype(np.int16)


#: the workers' kernel columns read while the kernels table is built, each with the last column
#: built from it (in :data:`KERNEL_SCHEMA` order); the others are read before or not at all
_RAW_LAST_READ = {
    "name": "name",  # norm_name shares the name array
    "cat": "kind",
    "dur": "dur_ns",
    "stream": "stream",
    "tid": "stream",
    "correlation": "correlation",
    **{f"grid_{ax}": f"grid_{ax}" for ax in "xyz"},
    **{f"block_{ax}": f"block_{ax}" for ax in "xyz"},
    "registers": "registers",
    "shared_mem": "shared_mem",
    "external_id": "launch_op_id",
    "bytes": "bytes_recorded",
}


def _grid(k: pa.Table, ax: str, workitems: np.ndarray | None) -> pa.Array:
    """Blocks along ``ax``; ROCm grids given in work-items (``hipExtModuleLaunchKernel``) divided
    by the block size."""
    g = _np(k[f"grid_{ax}"])
    if workitems is None:
        return _to_int32(g)
    g = g.astype(np.float64)
    b = _np(k[f"block_{ax}"]).astype(np.float64)
    ok = workitems & ~np.isnan(g) & ~np.isnan(b) & (b > 0)
    g[ok] = np.ceil(g[ok] / b[ok])
    return _to_int32(g)


def _np(col: pa.ChunkedArray | pa.Array) -> np.ndarray:
    return col.to_numpy(zero_copy_only=False)


def _to_int32(values: np.ndarray | pa.Array) -> pa.Array:
    arr = np.asarray(values, dtype=np.float64)
    mask = np.isnan(arr) | (arr > 2**31 - 1) | (arr < -(2**31))
    with np.errstate(invalid="ignore"):
        ints = arr.astype(np.int32)  # the masked slots are set just below: no float64 copy zeroed first
    ints[mask] = 0
    return pa.array(ints, mask=mask)


def _fill0(col: pa.ChunkedArray | pa.Array) -> pa.Array:
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    return pa.compute.fill_null(arr, 0)


def _shift(col: pa.ChunkedArray | pa.Array, base: int) -> pa.Array:
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if not base:
        return arr
    return pa.compute.add(arr, pa.scalar(base, pa.int64()))


def _base_ns(meta_obj: dict[str, Any]) -> int:
    b = meta_obj.get("baseTimeNanoseconds")
    return b if isinstance(b, int) and b > 0 else 0


def _launch_info(k: pa.Table, host: pa.Table) -> tuple[pa.Array, pa.Array]:
    """Name of the runtime/driver call with the same correlation, and whether it is a graph launch."""
    n = k.num_rows
    corr = (
        k["correlation"].combine_chunks()
        if isinstance(k["correlation"], pa.ChunkedArray)
        else k["correlation"]
    )
    none = pa.nulls(n, pa.string()), pa.array(np.zeros(n, bool))
    if host.num_rows == 0 or corr.null_count == n:
        return none
    launches = launch_calls(host, ["correlation", "name"])
    if launches.num_rows == 0:
        return none
    pos = lookup.index_in(corr, launches["correlation"])  # first match per correlation
    names = dict_take(launches["name"], pos)
    # the pattern is tested once per distinct call name, not once per kernel
    graph = pc.match_substring_regex(names.dictionary, _GRAPH_LAUNCH.pattern).take(names.indices)
    return names, pc.fill_null(graph, False)


# --------------------------------------------------------------------------- metadata


def _uses_hip(host: pa.Table | None) -> bool:
    """ROCm builds keep CUDA category names but call HIP APIs."""
    if host is None or host.num_rows == 0:
        return False
    names = host["name"].combine_chunks()
    dic = names.dictionary if isinstance(names, pa.DictionaryArray) else pa.compute.unique(names)
    return bool(pa.compute.any(pa.compute.starts_with(dic, "hip")).as_py())


def _input_meta(path: Path, m: dict[str, Any], hip_calls: bool = False) -> InputMeta:
    meta = InputMeta(path=str(path), format=FORMAT, reader_version=READER_VERSION)
    rocm = hip_calls or any(
        k in m for k in ("roctracer_version", "hip_runtime_version", "hip_driver_version")
    )
    meta.extra["rocm"] = rocm
    for key in (
        "cuda_runtime_version",
        "cuda_driver_version",
        "cupti_version",
        "hip_runtime_version",
        "hip_driver_version",
        "roctracer_version",
    ):
        if key in m and isinstance(m[key], (int, float, str)):
            meta.versions[key] = str(m[key])
    for key in ("record_shapes", "with_stack", "with_flops", "profile_memory", "trace_id", "traceName"):
        if key in m and isinstance(m[key], (int, float, str)):
            meta.extra[key] = m[key]
    devs = m.get("deviceProperties")
    if isinstance(devs, list):
        meta.devices = [d for d in devs if isinstance(d, dict)]
    if meta.devices:
        d0 = meta.devices[0]
        name = d0.get("name")
        meta.gpu_name = name if isinstance(name, str) else None
        major, minor = d0.get("computeMajor"), d0.get("computeMinor")
        if isinstance(major, int) and isinstance(minor, int):
            meta.arch = _arch(rocm, major, minor)
        sms = d0.get("numSms")
        meta.sm_count = sms if isinstance(sms, int) else None
        mem = d0.get("totalGlobalMem")
        meta.total_memory = mem if isinstance(mem, int) else None
    dist = m.get("distributedInfo")
    if isinstance(dist, dict):
        r, ws = dist.get("rank"), dist.get("world_size")
        meta.rank = r if isinstance(r, int) and 0 <= r < 2**15 else 0
        meta.world_size = ws if isinstance(ws, int) and ws > 0 else 1
        if isinstance(dist.get("backend"), str):
            meta.extra["dist_backend"] = dist["backend"]
        if isinstance(dist.get("nccl_version"), str):
            meta.versions["nccl"] = dist["nccl_version"]
    else:
        r = _rank_from_name(path.name)
        if r is not None:
            meta.rank = r
    return meta


# Kineto on ROCm reports gfx major/minor without the stepping digit (observed: MI250 9/0,
# MI300X 9/4, MI350X 9/5); the full gfx names of the shipping parts.
_ROCM_ARCH = {(9, 0): "gfx90a", (9, 4): "gfx942", (9, 5): "gfx950", (12, 0): "gfx1201", (11, 0): "gfx1100"}


def _arch(rocm: bool, major: int, minor: int) -> str:
    if rocm:
        return _ROCM_ARCH.get((major, minor), f"gfx{major}{minor:x}")
    return f"sm_{major}{minor}"


_RANK_PATTERNS = (re.compile(r"-TP-(\d{1,4})"), re.compile(r"rank[_-]?(\d{1,4})", re.I))


def _rank_from_name(name: str) -> int | None:
    for pat in _RANK_PATTERNS:
        m = pat.search(name)
        if m:
            return int(m.group(1))
    return None
