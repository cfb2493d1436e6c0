"""Per-kernel table of an Nsight Compute run (issue 8's per-kernel profile): reads what `ncu --section SpeedOfLight
--csv --page details ...` printed (scripts/gpu_profile_prefill.sh runs it over one prefill chunk of the 27B) and
sums each kernel's launches: count, total and mean duration, share of the whole, mean DRAM and SM throughput.
Kernels are named without their parameter lists and CUTLASS's template arguments (CUTLASS's GEMMs as `cutlass
GEMM`), keeping the engine's template arguments (dequant_f16_kernel<12> is the Q4_K one). Prints JSON on stdout and
the table on stderr.

    python native/bench/ncu_kernel_table.py ncu.csv > table.json
"""

from __future__ import annotations

import csv
import json
import sys
from collections import defaultdict
from pathlib import Path

DURATION_NS = {"ns": 1.0, "nsecond": 1.0, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6, "s": 1e9,
               "second": 1e9}


def opening(text: str, end: int, close: str, open_: str) -> int:
    """Where the bracket that text[end - 1] (a `close`) closes opens: scanning back, nested pairs skipped; end if
    text[:end] does not end with `close` or the bracket never opens."""
    if not text[:end].endswith(close):
        return end
    depth = 0
    for i in range(end - 1, -1, -1):
        depth += 1 if text[i] == close else -1 if text[i] == open_ else 0
        if depth == 0:
            return i
    return end


def short_name(kernel: str) -> str:
    """`void openjet::<unnamed>::dequant_f16_kernel<12>(const unsigned char *, ...)` -> `dequant_f16_kernel<12>`;
    any CUTLASS kernel -> `cutlass GEMM`. Scans from the end (ncu may print the anonymous namespace with an unmatched
    bracket, `unnamed>::`): the parameter list, then the template arguments, then the identifier."""
    if "cutlass" in kernel:
        return "cutlass GEMM"
    end = opening(kernel, len(kernel.rstrip()), ")", "(")  # the parameter list dropped
    start = opening(kernel, end, ">", "<")                # the template arguments kept
    while start > 0 and (kernel[start - 1].isalnum() or kernel[start - 1] == "_"):
        start -= 1
    return kernel[start:end].replace("openjet::", "")


def number(text: str) -> float:
    return float(text.replace(",", ""))


def launches(lines) -> list[dict]:
    """One dict per profiled launch: id, kernel, grid, duration_ns and the SpeedOfLight percentages."""
    rows = csv.reader(line for line in lines if line.startswith('"'))
    header = next(rows, None)
    if header is None:
        raise ValueError("no ncu CSV rows (was ncu run with --csv --page details?)")
    col = {name: i for i, name in enumerate(header)}
    for need in ("ID", "Kernel Name", "Grid Size", "Metric Name", "Metric Unit", "Metric Value"):
        if need not in col:
            raise ValueError(f"ncu CSV without a {need!r} column")
    out: dict[str, dict] = {}
    for r in rows:
        if r[col["ID"]] == "ID":  # a second run's header
            continue
        one = out.setdefault(r[col["ID"]], {"id": int(r[col["ID"]]), "kernel": r[col["Kernel Name"]],
                                              "grid": r[col["Grid Size"]]})
        metric, unit, value = r[col["Metric Name"]], r[col["Metric Unit"]], r[col["Metric Value"]]
        if metric == "Duration":
            if unit not in DURATION_NS:
                raise ValueError(f"launch {one['id']}: a duration in {unit!r}")
            one["duration_ns"] = number(value) * DURATION_NS[unit]
        elif metric in ("DRAM Throughput", "Compute (SM) Throughput") and unit == "%":
            one["dram_pct" if metric.startswith("DRAM") else "sm_pct"] = number(value)
    missing = [o["id"] for o in out.values() if "duration_ns" not in o]
    if missing:
        raise ValueError(f"launches without a Duration (the SpeedOfLight section): {missing[:5]}")
    return sorted(out.values(), key=lambda o: o["id"])


def table(runs: list[dict]) -> dict:
    """Launches summed per short kernel name, longest total first."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for o in runs:
        groups[short_name(o["kernel"])].append(o)
    total_ns = sum(o["duration_ns"] for o in runs)
    rows = []
    for name, group in groups.items():
        ns = sum(o["duration_ns"] for o in group)
        mean = lambda key: round(sum(o.get(key, 0.0) for o in group) / len(group), 1)  # noqa: E731
        rows.append({"kernel": name, "launches": len(group), "total_us": round(ns / 1e3, 1),
                     "mean_us": round(ns / 1e3 / len(group), 1), "share": round(ns / total_ns, 4),
                     "dram_pct": mean("dram_pct"), "sm_pct": mean("sm_pct")})
    rows.sort(key=lambda r: -r["total_us"])
    return {"launches": len(runs), "total_us": round(total_ns / 1e3, 1), "kernels": rows}


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    try:
        t = table(launches(Path(sys.argv[1]).read_text(errors="replace").splitlines()))
    except (OSError, ValueError) as e:
        sys.exit(f"ncu_kernel_table.py: {sys.argv[1]}: {e}")
    json.dump(t, sys.stdout, indent=1)
    print(f"{t['launches']} launches, {t['total_us'] / 1e3:.2f} ms (kernel durations as ncu measured them, one at "
          "a time)", file=sys.stderr)
    print(f"{'kernel':<44} {'n':>5} {'total ms':>9} {'share':>6} {'mean us':>8} {'DRAM%':>6} {'SM%':>6}",
          file=sys.stderr)
    for r in t["kernels"]:
        print(f"{r['kernel'][:44]:<44} {r['launches']:>5} {r['total_us'] / 1e3:>9.2f} {100 * r['share']:>5.1f}% "
              f"{r['mean_us']:>8.1f} {r['dram_pct']:>6.1f} {r['sm_pct']:>6.1f}", file=sys.stderr)


if __name__ == "__main__":
    main()
