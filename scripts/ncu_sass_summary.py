"""Summarise Nsight Compute's SASS source page (ncu --page source --print-source sass --csv): per kernel launch, the
warp-state samples by opcode and by stall reason, and the instructions holding most of them.

    python3 scripts/ncu_sass_summary.py source.csv [details.csv]

The page's layout differs between Nsight Compute versions, so the columns are found by name: a header row names
"Source" (the SASS text) and one or more sample columns ("Warp Stall Sampling (All Samples)", per-reason columns
such as "stall_long_sb"). Where no such header is found, the file's first lines are printed instead.
"""

from __future__ import annotations

import csv
import re
import sys
from collections import Counter


def number(cell: str) -> float:
    try:
        return float(cell.replace(",", ""))
    except ValueError:
        return 0.0


def sections(rows: list[list[str]]):
    """(label, header, body rows) for each block of the page that starts with a header naming "Source"."""
    label, header, body = "", None, []
    for row in rows:
        if any(c.strip() == "Source" for c in row):
            if header:
                yield label, header, body
            header, body = row, []
        elif header and len(row) == len(header):
            body.append(row)
        else:
            if header:
                yield label, header, body
                header, body = None, []
            label = " ".join(c for c in row if c)[:200]
    if header:
        yield label, header, body


def opcode(sass: str) -> str:
    text = re.sub(r"^@!?U?P\w+\s+", "", sass.strip())
    return text.split(" ")[0] if text else "?"


def summarise(label: str, header: list[str], body: list[list[str]], out) -> None:
    col = {name: i for i, name in enumerate(header)}
    src = col["Source"]
    total_name = next((n for n in header if "All Samples" in n), None) or next(
        (n for n in header if "Samples" in n), None)
    if total_name is None:
        print(f"== {label}: no sample column in {header[:12]}", file=out)
        return
    total_i = col[total_name]
    reasons = [n for n in header if n.startswith("stall_") and "Not Issued" not in n]  # the rest are a subset
    samples = [(number(r[total_i]), r) for r in body]
    whole = sum(s for s, _ in samples) or 1.0
    print(f"== {label}\n  {len(body)} instructions, {whole:.0f} samples ({total_name})", file=out)
    by_op: Counter = Counter()
    for s, r in samples:
        by_op[opcode(r[src])] += s
    print("  by opcode: " + ", ".join(f"{op} {100 * s / whole:.1f}%" for op, s in by_op.most_common(14)), file=out)
    if reasons:
        by_reason = Counter({n: sum(number(r[col[n]]) for r in body) for n in reasons})
        print("  by reason: " + ", ".join(f"{n} {100 * s / whole:.1f}%" for n, s in by_reason.most_common(10) if s),
              file=out)
    addr = col.get("Address", col.get("# Address"))
    shown = 0.0
    for s, r in sorted(samples, key=lambda p: -p[0]):
        if shown >= 0.9 * whole or s <= 0:
            break
        shown += s
        top = ""
        if reasons:
            top = " [" + ", ".join(f"{n.replace('stall_', '')} {number(r[col[n]]):.0f}" for n in
                                   sorted(reasons, key=lambda n: -number(r[col[n]]))[:3] if number(r[col[n]])) + "]"
        where = r[addr] if addr is not None else "?"
        print(f"  {100 * s / whole:5.1f}%  {where:>6}  {r[src].strip()[:90]}{top}", file=out)


def details(path: str, out) -> None:
    """Each launch's duration and DRAM throughput from the details page (and its caches' hit rates and L2 traffic
    where the profile took MemoryWorkloadAnalysis: gpu_ncu_sass.sh's SECTIONS)."""
    want = ("Duration", "DRAM Throughput", "Memory Throughput", "Registers Per Thread", "Grid Size", "L1/TEX Hit Rate",
            "L2 Hit Rate", "L1/TEX Cache Throughput", "L2 Cache Throughput", "Mem Busy")
    rows = list(csv.reader(open(path, newline="")))
    if not rows:
        return
    head = rows[0]
    try:
        i_id, i_name, i_metric, i_unit, i_value = (head.index(n) for n in
                                                   ("ID", "Kernel Name", "Metric Name", "Metric Unit", "Metric Value"))
    except ValueError:
        return
    seen: dict = {}
    for r in rows[1:]:
        if len(r) > i_value and r[i_metric] in want:
            seen.setdefault((r[i_id], r[i_name][:70]), []).append(f"{r[i_metric]} {r[i_value]} {r[i_unit]}")
    for (i, name), vals in seen.items():
        print(f"launch {i} {name}: " + "; ".join(vals), file=out)


def main() -> None:
    rows = list(csv.reader(open(sys.argv[1], newline="", errors="replace")))
    if len(sys.argv) > 2:
        details(sys.argv[2], sys.stdout)
    found, last = False, None
    for label, header, body in sections(rows):
        found = True
        if (label, body) == last:  # the page lists each launch's instructions twice on some versions
            continue
        last = (label, body)
        summarise(label, header, body, sys.stdout)
    if not found:
        print("no header naming 'Source'; the page's first lines:")
        for r in rows[:30]:
            print("  ", r[:10])


if __name__ == "__main__":
    main()
