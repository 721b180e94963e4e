"""Multi-rank runs: time per rank, and collective time split into transfer and waiting for a slower rank.

Contract: pure functions over the analysed kernels table (README.md's "Output columns" plus ``stage``, ``phase``
and ``step``); no I/O. :func:`rank_summary` returns the ``"ranks"`` section of the summary, or ``None``
when the run has a single rank. All times are integer ns.

How communication time is split. A collective kernel (stage ``communication``) cannot finish before
every rank has joined it, so on a rank that starts early part of its duration is spent waiting for the
last rank to arrive. The collectives are matched across ranks by their order on each rank's
communication stream(s): when every rank issues the same sequence of kernel names, the n-th collective
on each rank is the same collective; otherwise the k-th occurrence of each name is matched, and what
cannot be matched is counted apart and said so. For a matched collective with starts ``s_r`` and
durations ``d_r``: ``last = max_r s_r``, ``wait_r = min(d_r, max(0, last - s_r))`` and
``transfer_r = d_r - wait_r``. The rank others wait for in a step (the slowest) is the one with the
least wait over that step's collectives; ties go to the rank that arrived last most often.

Assumptions, stated in the result's ``notes``: the ranks share one clock (ranks of one host do: the
traces carry absolute ns; ranks on different hosts carry each host's clock, and a check flags
collectives that end on a rank before another rank starts them), every rank takes part in every
collective (one process group), and a collective's step and phase are those of the lowest rank.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

COMM_STAGE = "communication"
TOP_SKEW = 10
# A collective that ends on some rank earlier than this before the last rank starts it means the ranks'
# clocks disagree; more than this share of such collectives makes the split unreliable.
CLOCK_TOLERANCE_NS = 2_000
CLOCK_BAD_SHARE = 0.05


def rank_summary(kernels: pa.Table | pd.DataFrame, top: int = TOP_SKEW) -> dict[str, Any] | None:
    """The ``"ranks"`` summary section; ``None`` unless the kernels come from more than one rank."""
    df = _frame(kernels)
    ranks = sorted(int(r) for r in pd.unique(df["rank"])) if len(df) else []
    if len(ranks) < 2:
        return None
    comm = collective_rows(df)
    match = match_collectives(comm, ranks)
    split = split_waits(comm, match["index"])
    notes = list(match["notes"])
    notes.extend(_clock_notes(split))
    notes.append(
        "assumes every rank takes part in every collective (one process group) and one clock for all ranks;"
        " a collective's step and phase are those of the lowest rank"
    )
    return {
        "ranks": ranks,
        "matching": match["method"],
        "matched_collectives": int(len(match["index"])),
        "per_rank": per_rank_rows(df, comm, ranks, split),
        "collectives": collective_stats(comm, split),
        "skew_events": skew_events(comm, split, ranks, top),
        "steps": slowest_by_step(comm, split, ranks),
        "notes": notes,
    }


def _frame(kernels: pa.Table | pd.DataFrame) -> pd.DataFrame:
    df = kernels.to_pandas() if isinstance(kernels, pa.Table) else kernels
    if "aggregate" in df:
        df = df[~df["aggregate"].astype(bool)]
    return df


def collective_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Timed communication kernels, ordered by (rank, stream, start), with a plain string name."""
    comm = df[df["stage"].astype(str) == COMM_STAGE]
    cols = ["rank", "stream", "start_ns", "dur_ns", "phase", "step"]
    out = comm[cols].copy()
    name_col = "norm_name" if "norm_name" in comm else "name"
    out["name"] = comm[name_col].astype(str)
    out["stream"] = out["stream"].fillna(-1).astype(np.int64)
    out["rank"] = out["rank"].astype(np.int64)
    out["phase"] = out["phase"].astype(str)
    out["step"] = out["step"].fillna(-1).astype(np.int64)
    out = out.sort_values(["rank", "stream", "start_ns"], kind="stable").reset_index(drop=True)
    return out


def match_collectives(comm: pd.DataFrame, ranks: list[int]) -> dict[str, Any]:
    """Match each rank's collectives to the same collective on the other ranks.

    Returns ``index``: an (n, len(ranks)) int array of row positions in ``comm`` (one row per
    matched collective, ordered by the lowest rank's start), ``method`` (``order``, ``name`` or
    ``none``) and ``notes`` saying what could not be matched.
    """
    notes: list[str] = []
    empty = np.empty((0, len(ranks)), np.int64)
    by_rank = {r: comm[comm["rank"] == r] for r in ranks}
    missing = [r for r in ranks if by_rank[r].empty]
    if missing:
        have = [r for r in ranks if r not in missing]
        notes.append(
            f"collectives cannot be matched across ranks: rank(s) {missing} run no communication kernel"
            + (f" (rank(s) {have} do)" if have else "")
        )
        return {"index": empty, "method": "none", "notes": notes}
    # Pair the communication streams of the ranks by their order of first use; stream ids differ.
    streams = {r: _streams_in_order(by_rank[r]) for r in ranks}
    if len({len(s) for s in streams.values()}) == 1:
        pairs = [[streams[r][j] for r in ranks] for j in range(len(streams[ranks[0]]))]
    else:
        counts = ", ".join(f"rank {r}: {len(streams[r])}" for r in ranks)
        notes.append(
            f"ranks use different numbers of communication streams ({counts}): matched on one merged sequence"
        )
        pairs = [[None] * len(ranks)]
    blocks, methods = [], []
    for pair in pairs:
        seqs = []
        for r, s in zip(ranks, pair, strict=True):
            sub = by_rank[r] if s is None else by_rank[r][by_rank[r]["stream"] == s]
            sub = sub.sort_values("start_ns", kind="stable")
            seqs.append((sub.index.to_numpy(np.int64), sub["name"].to_numpy(object)))
        idx, method, note = _match_sequences(seqs, ranks)
        blocks.append(idx)
        methods.append(method)
        if note:
            notes.append(note)
    index = np.concatenate(blocks) if blocks else empty
    if len(index):
        order = np.argsort(comm["start_ns"].to_numpy(np.int64)[index[:, 0]], kind="stable")
        index = index[order]
    method = "none" if not len(index) else ("order" if all(m == "order" for m in methods) else "name")
    return {"index": index, "method": method, "notes": notes}


def _streams_in_order(sub: pd.DataFrame) -> list[int]:
    first = sub.groupby("stream")["start_ns"].min().sort_values(kind="stable")
    return [int(s) for s in first.index]


def _match_sequences(
    seqs: list[tuple[np.ndarray, np.ndarray]], ranks: list[int]
) -> tuple[np.ndarray, str, str | None]:
    lengths = [len(rows) for rows, _ in seqs]
    names0 = seqs[0][1]
    if len(set(lengths)) == 1 and all(np.array_equal(names0, n) for _, n in seqs[1:]):
        return np.stack([rows for rows, _ in seqs], axis=1), "order", None
    # Different sequences: the k-th occurrence of each name is the same collective.
    per_name: list[dict[str, np.ndarray]] = []
    for rows, names in seqs:
        d: dict[str, list[int]] = {}
        for row, n in zip(rows, names, strict=True):
            d.setdefault(n, []).append(int(row))
        per_name.append({k: np.asarray(v, np.int64) for k, v in d.items()})
    common = set(per_name[0]).intersection(*per_name[1:])
    cols: list[list[np.ndarray]] = [[] for _ in ranks]
    for name in sorted(common):
        k = min(len(p[name]) for p in per_name)
        for j, p in enumerate(per_name):
            cols[j].append(p[name][:k])
    matched = sum(len(c) for c in cols[0])
    counts = ", ".join(f"rank {r}: {n}" for r, n in zip(ranks, lengths, strict=True))
    if not matched:
        note = f"collectives cannot be matched across ranks: no kernel name is common to all ranks ({counts})"
        return np.empty((0, len(ranks)), np.int64), "none", note
    index = np.stack([np.concatenate(c) for c in cols], axis=1)
    unmatched = sum(lengths) - matched * len(ranks)
    note = (
        f"collective sequences differ between ranks ({counts}): matched by name and order;"
        f" {matched} matched, {unmatched} kernel(s) left unmatched"
    )
    return index, "name", note


def split_waits(comm: pd.DataFrame, index: np.ndarray) -> dict[str, np.ndarray]:
    """Per matched collective and rank: start, duration, wait for the last rank, transfer."""
    start = comm["start_ns"].to_numpy(np.int64)[index] if len(index) else np.empty(index.shape, np.int64)
    dur = comm["dur_ns"].to_numpy(np.int64)[index] if len(index) else np.empty(index.shape, np.int64)
    last = start.max(axis=1, initial=np.iinfo(np.int64).min) if len(index) else np.empty(0, np.int64)
    wait = np.minimum(dur, np.maximum(0, last[:, None] - start))
    return {"index": index, "start": start, "dur": dur, "last": last, "wait": wait, "transfer": dur - wait}


def _clock_notes(split: dict[str, np.ndarray]) -> list[str]:
    n = len(split["last"])
    if not n:
        return []
    early = ((split["start"] + split["dur"]).min(axis=1) < split["last"] - CLOCK_TOLERANCE_NS).sum()
    if early / n <= CLOCK_BAD_SHARE:
        return []
    return [
        f"{int(early)} of {n} collectives end on some rank before another rank starts them: the ranks' clocks"
        " disagree (ranks on different hosts?), so the wait/transfer split is unreliable"
    ]


def per_rank_rows(
    df: pd.DataFrame, comm: pd.DataFrame, ranks: list[int], split: dict[str, np.ndarray]
) -> list[dict[str, Any]]:
    """Stage and phase time per rank, and its communication split into transfer and waiting."""
    from analyzer.tables import intervals

    rows = []
    index = split["index"]
    last_rank = _last_arrivals(split)
    # only the columns read here, and each rank's rows by position: a boolean mask per rank would
    # copy every column of the whole run once per rank
    df = df[["rank", "trace_id", "device", "start_ns", "dur_ns", "stage", "phase"]]
    rows_of = df.groupby("rank", sort=False).indices
    for j, r in enumerate(ranks):
        sub = df.iloc[rows_of.get(r, np.empty(0, np.int64))]
        kernel_ns = int(sub["dur_ns"].sum())
        busy = devices = 0
        for _, g in sub.groupby("device", sort=True):  # a rank's GPU, whichever of its files saw it
            s = g["start_ns"].to_numpy(np.int64)
            busy += intervals.busy_ns(s, s + g["dur_ns"].to_numpy(np.int64))
            devices += 1
        start = sub["start_ns"].to_numpy(np.int64)
        wall = intervals.span_ns(start, start + sub["dur_ns"].to_numpy(np.int64)) if len(sub) else 0
        stages = _time_by(sub, "stage").sort_values(ascending=False, kind="stable")
        phases = _time_by(sub, "phase")
        comm_ns = int(comm.loc[comm["rank"] == r, "dur_ns"].sum())
        wait = int(split["wait"][:, j].sum()) if len(index) else 0
        transfer = int(split["transfer"][:, j].sum()) if len(index) else 0
        rows.append(
            {
                "rank": r,
                "trace_ids": sorted(int(t) for t in pd.unique(sub["trace_id"])),
                "kernel_ns": kernel_ns,
                "busy_ns": int(busy),
                "wall_ns": int(wall),
                # the rank's own idle share: a late rank idles where the run's average hides it
                "idle_fraction": float(1 - busy / (devices * wall)) if devices and wall else None,
                "phases": {str(p): int(t) for p, t in phases.items()},
                "stages": [
                    {"stage": str(s), "time_ns": int(t), "share": float(t / kernel_ns) if kernel_ns else 0.0}
                    for s, t in stages.items()
                ],
                "comm_ns": comm_ns,
                "comm_count": int((comm["rank"] == r).sum()),
                "comm_wait_ns": wait,
                "comm_transfer_ns": transfer,
                "comm_unmatched_ns": comm_ns - wait - transfer,
                "last_arrivals": int((last_rank == j).sum()),
            }
        )
    return rows


def _time_by(sub: pd.DataFrame, column: str) -> pd.Series:
    """Kernel time per value of a label column, keyed by the value as text in text order (grouping
    the categorical itself, not a per-row text copy of it)."""
    t = sub.groupby(column, observed=True, dropna=False)["dur_ns"].sum()
    t.index = t.index.astype(str)
    return t.groupby(level=0).sum().sort_index()


def _last_arrivals(split: dict[str, np.ndarray]) -> np.ndarray:
    """Column of the rank that started each matched collective last (lowest rank on a tie)."""
    if not len(split["start"]):
        return np.empty(0, np.int64)
    return np.argmax(split["start"], axis=1)


def collective_stats(comm: pd.DataFrame, split: dict[str, np.ndarray]) -> list[dict[str, Any]]:
    """Per collective kernel name and phase: how many, total time over ranks, waiting, transfer, skew."""
    index = split["index"]
    if not len(index):
        return []
    ref = comm.iloc[index[:, 0]]
    frame = pd.DataFrame(
        {
            "name": ref["name"].to_numpy(object),
            "phase": ref["phase"].to_numpy(object),
            "time": split["dur"].sum(axis=1),
            "wait": split["wait"].sum(axis=1),
            "transfer": split["transfer"].sum(axis=1),
            "transfer_mean": split["transfer"].mean(axis=1),
            "skew": split["last"] - split["start"].min(axis=1),
        }
    )
    rows = []
    for (name, phase), g in frame.groupby(["name", "phase"], sort=True):
        skew = g["skew"].to_numpy(np.float64)
        rows.append(
            {
                "name": name,
                "phase": phase,
                "count": int(len(g)),
                "time_ns": int(g["time"].sum()),
                "wait_ns": int(g["wait"].sum()),
                "transfer_ns": int(g["transfer"].sum()),
                "transfer_p50_ns": int(np.percentile(g["transfer_mean"].to_numpy(np.float64), 50)),
                "skew_ns": {
                    "p50": int(np.percentile(skew, 50)),
                    "p90": int(np.percentile(skew, 90)),
                    "max": int(skew.max()),
                },
            }
        )
    rows.sort(key=lambda r: (-r["wait_ns"], -r["time_ns"], r["name"], r["phase"]))
    return rows


def skew_events(
    comm: pd.DataFrame, split: dict[str, np.ndarray], ranks: list[int], top: int = TOP_SKEW
) -> list[dict[str, Any]]:
    """The matched collectives where some rank waited longest for the last one, longest first."""
    index = split["index"]
    if not len(index):
        return []
    worst = split["wait"].max(axis=1)
    order = np.lexsort((np.arange(len(worst)), -worst))
    last = _last_arrivals(split)
    out = []
    for i in order[:top]:
        if worst[i] <= 0:
            break
        ref = comm.iloc[int(index[i, 0])]
        out.append(
            {
                "index": int(i),
                "name": ref["name"],
                "phase": ref["phase"],
                "step": int(ref["step"]),
                "last_rank": ranks[int(last[i])],
                "skew_ns": int(split["last"][i] - split["start"][i].min()),
                "ranks": [
                    {
                        "rank": r,
                        "start_ns": int(split["start"][i, j]),
                        "dur_ns": int(split["dur"][i, j]),
                        "wait_ns": int(split["wait"][i, j]),
                        "transfer_ns": int(split["transfer"][i, j]),
                    }
                    for j, r in enumerate(ranks)
                ],
            }
        )
    return out


def slowest_by_step(
    comm: pd.DataFrame, split: dict[str, np.ndarray], ranks: list[int]
) -> list[dict[str, Any]]:
    """Per step (of the lowest rank): each rank's wait and last arrivals, and the rank the others waited for."""
    index = split["index"]
    if not len(index):
        return []
    ref = comm.iloc[index[:, 0]]
    steps = ref["step"].to_numpy(np.int64)
    uniq, inv = np.unique(steps, return_inverse=True)
    n_ranks = len(ranks)
    wait = np.zeros((len(uniq), n_ranks), np.int64)
    np.add.at(wait, inv, split["wait"])
    lasts = np.zeros((len(uniq), n_ranks), np.int64)
    np.add.at(lasts, (inv, _last_arrivals(split)), 1)
    count = np.bincount(inv, minlength=len(uniq))
    # least wait first, then most last arrivals, then the lowest rank
    cols = np.tile(np.arange(n_ranks), len(uniq))
    rows = np.repeat(np.arange(len(uniq)), n_ranks)
    order = np.lexsort((cols, -lasts.ravel(), wait.ravel(), rows))
    slow = cols[order[::n_ranks]]
    # a step's phase: the most common among its collectives (ties: alphabetical)
    ph = pd.DataFrame({"step": steps, "phase": ref["phase"].to_numpy(object)})
    ph = ph.groupby(["step", "phase"]).size().reset_index(name="n")
    ph = ph.sort_values(["step", "n", "phase"], ascending=[True, False, True]).drop_duplicates("step")
    phase_of = dict(zip(ph["step"].tolist(), ph["phase"].tolist(), strict=True))
    out = []
    for i, step in enumerate(uniq.tolist()):
        j = int(slow[i])
        out.append(
            {
                "step": int(step),
                "phase": str(phase_of[step]),
                "collectives": int(count[i]),
                "slowest_rank": ranks[j],
                "others_wait_ns": int(wait[i].sum() - wait[i, j]),
                "ranks": [
                    {"rank": r, "wait_ns": int(wait[i, k]), "last_arrivals": int(lasts[i, k])}
                    for k, r in enumerate(ranks)
                ],
            }
        )
    return out
