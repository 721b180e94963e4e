"""rocprof's `<barrier packet>` pseudo-dispatches: their own rule, no numbers, no findings, their own summary line."""

from __future__ import annotations

import io
from pathlib import Path

from analyzer.knowledge.kernel_rules import BARRIER_RULE_ID, classify_names, default_rules
from analyzer.report import text
from analyzer.results.summary import build_summary
from tests.conftest import shared
from tests.runs import analyze_paths

V1_CSV = "rocprofv1-llamacpp-r9700/results.csv"


def test_barrier_names_get_their_own_rule() -> None:
    # GIVEN the spellings rocprof v1 writes (results.csv / .json plain, results.db quoted)
    rows = classify_names(['"<barrier packet>"', "<barrier packet>", "barrier_kernel"], default_rules())
    # THEN the pseudo-dispatches are MEM600, stage other, provider runtime; a kernel named barrier is not
    assert [(r["rule_id"], r["stage"], r["provider"]) for r in rows[:2]] == [
        (BARRIER_RULE_ID, "other", "runtime")
    ] * 2
    assert rows[1]["norm_name"] == "<barrier packet>"
    assert rows[2]["rule_id"] != BARRIER_RULE_ID


def _with_barriers(tmp_path: Path) -> tuple[Path, int, int]:
    """A real rocprof v1 results.csv (its first 120 dispatches) with two barrier packets inserted,
    as rocprof v1 writes them when HIP/HSA tracing records the runtime's barrier-AND packets."""
    lines = shared(V1_CSV).read_text(encoding="utf-8").splitlines()[:121]
    head, rows = lines[0], lines[1:]
    fields = rows[10].split(",")
    out = [head, *rows[:10]]
    for k, dur in ((0, 250_000), (1, 750_000)):
        f = list(fields)
        f[1] = '"<barrier packet>"'
        begin = int(f[18]) + 10 + k
        f[17], f[18], f[19], f[20], f[21] = (
            str(begin),
            str(begin),
            str(begin + dur),
            str(begin + dur),
            str(dur),
        )
        out.append(",".join(f))
    out.extend(rows[10:])
    p = tmp_path / "results.csv"
    p.write_text("\n".join(out) + "\n", encoding="utf-8")
    return p, 2, 1_000_000


def test_summary_reports_barriers_on_their_own_line(tmp_path: Path) -> None:
    # GIVEN a rocprof v1 trace with barrier packets
    path, n, ns = _with_barriers(tmp_path)
    a = analyze_paths([str(path)])
    s = build_summary(a)
    # THEN the summary counts them on their own, outside the unclassified list
    bp = s["barrier_packets"]
    assert (bp["count"], bp["time_ns"]) == (n, ns)
    assert bp["share"] == ns / s["totals"]["kernel_ns"]
    assert all("barrier packet" not in r["norm_name"] for r in s["unclassified"])
    # AND the roofline gives them no numbers, no finding names them
    k = a.kernels.to_pandas()
    bar = k[k["rule_id"] == BARRIER_RULE_ID]
    assert len(bar) == n and bar["flops"].isna().all() and bar["bytes"].isna().all()
    assert set(bar["bound"].astype(str)) <= {"unknown"}
    for f in s["findings"]:
        assert not any("barrier packet" in g for g in f["group_keys"]), f["id"]
        assert "barrier packet" not in str(f["evidence"]), f["id"]
    # AND `analyze` prints one line for them
    out = io.StringIO()
    text.render(s, out)
    lines = [ln for ln in out.getvalue().splitlines() if ln.startswith("Barrier packets:")]
    assert len(lines) == 1 and f"{n:,} rocprof <barrier packet> dispatches" in lines[0]


def test_no_barrier_line_without_barriers(tmp_path: Path) -> None:
    p = tmp_path / "results.csv"
    p.write_text(
        "\n".join(shared(V1_CSV).read_text(encoding="utf-8").splitlines()[:60]) + "\n", encoding="utf-8"
    )
    s = build_summary(analyze_paths([str(p)]))
    assert s["barrier_packets"] == {"time_ns": 0, "share": 0.0, "count": 0}
    out = io.StringIO()
    text.render(s, out)
    assert "Barrier packets" not in out.getvalue()
