"""How much of a kernel name's classification survives a profiler cutting it at a column width.

Usage::

    python benchmarks/truncation.py [--widths 80,100] [--json OUT] [--show N]

Every full name of the kernel tables (``tests/data/kernel_tables/*.csv``; names already cut there are
left out) that is longer than the width is cut as ``nsys stats`` cuts it: the ``column`` / ``table``
formatters clip an auto-width column at 100 characters and mark the clip with one ``…`` (Nsight Systems
user guide, "Report Formatters Shipped With Nsight Systems"), so a cut name is ``name[: width - 1] + "…"``.
Each cut name is classified by the rule table and compared with the full name's classification:

* ``decided``: the cut name gets a stage that claims something: not the unclassified ``other`` (rule
  ``TRUNCATED`` or no rule), and not ``elementwise`` where the full name has a role (a generic kernel cut
  before its functor keeps the stage that claims no role: an abstention, as the rule table's spec says);
* ``wrong``: decided with a stage that is not the full name's (must stay 0: a cut name abstains rather
  than guess);
* ``provider``: decided with the full name's provider (``unknown`` where the cut tail could have named
  another library is an abstention, not an error).

Names are counted once (the tables share some); shares are of names, not of kernel time.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from analyzer.knowledge.kernel_rules import default_rules  # noqa: E402
from analyzer.knowledge.names import ELLIPSIS, is_truncated, normalize_name  # noqa: E402

TABLES = ROOT / "tests" / "data" / "kernel_tables"
#: the widths measured: 100 is what ``nsys stats`` prints by default; 80 a narrower column
WIDTHS = (80, 100)
#: the stage of a generic framework kernel with no role found: a cut name that keeps it abstains
GENERIC = "elementwise"


def full_names() -> list[str]:
    """Every distinct full (not already cut) kernel name of the kernel tables, in file order."""
    names: dict[str, None] = {}
    for path in sorted(TABLES.glob("*.csv")):
        with open(path, newline="", encoding="utf-8") as f:
            for row in csv.DictReader(f):
                n = row["name"]
                if not is_truncated(normalize_name(n)):
                    names.setdefault(n, None)
    return list(names)


def cut(name: str, width: int) -> str:
    """``name`` as a column of ``width`` characters shows it (nsys: clipped on the right, one ``…``)."""
    return name if len(name) <= width else name[: width - 1] + ELLIPSIS


def measure(width: int, names: list[str] | None = None) -> dict[str, Any]:
    """Counts for one width: names cut, decided, wrong, provider kept, and the wrong / undecided cases."""
    rs = default_rules()
    names = full_names() if names is None else names
    unclassified = rs.taxonomy.unclassified_stage
    out: dict[str, Any] = {"width": width, "cut": 0, "decided": 0, "wrong": 0, "provider": 0}
    wrong: list[str] = []
    undecided: list[str] = []
    for n in names:
        if len(n) <= width:
            continue
        full = rs.match(normalize_name(n), n)
        c = cut(n, width)
        got = rs.match(normalize_name(c), c)
        out["cut"] += 1
        if full.stage == unclassified:
            continue  # nothing to keep: the full name is unclassified too
        if got.stage == unclassified or (got.stage == GENERIC != full.stage):
            undecided.append(f"{c}  (full: {full.stage} {full.rule_id})")
            continue
        out["decided"] += 1
        out["provider"] += got.provider == full.provider
        if got.stage != full.stage:
            out["wrong"] += 1
            wrong.append(f"{c}  -> {got.stage} {got.rule_id} (full: {full.stage} {full.rule_id})")
    out["classified"] = sum(
        1 for n in names if len(n) > width and rs.match(normalize_name(n), n).stage != unclassified
    )
    out["decided_share"] = out["decided"] / out["classified"] if out["classified"] else 1.0
    out["wrong_cases"] = wrong
    out["undecided_cases"] = undecided
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--widths", default=",".join(map(str, WIDTHS)))
    ap.add_argument("--json", type=Path, help="write the counts as JSON")
    ap.add_argument("--show", type=int, default=0, help="print up to N undecided names per width")
    args = ap.parse_args(argv)
    results = [measure(int(w)) for w in args.widths.split(",")]
    print(
        "| width | names cut | classified in full | decided when cut | share | wrong stage | provider kept |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['width']} | {r['cut']} | {r['classified']} | {r['decided']} | "
            f"{100 * r['decided_share']:.1f}% | {r['wrong']} | {r['provider']} |"
        )
    for r in results:
        for line in r["wrong_cases"]:
            print(f"WRONG {r['width']}: {line}")
        for line in r["undecided_cases"][: args.show]:
            print(f"undecided {r['width']}: {line}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
