"""The row_copy microbenchmark's printout as a results JSON (date, commit, device, command).

``python scripts/microbench/to_json.py micro.txt --commit 002dfa6 --command "..." [--date ...]``
writes micro.json beside it (or ``--out``). Each timed line becomes a row with its group (the
``-- ...`` header above it), µs, TB/s, the ratio to the run's cudaMemcpy and whether its output
differed from the group's first variant.
"""
from __future__ import annotations

import argparse
import datetime
import json
import re
from pathlib import Path
from typing import Any

ROW = re.compile(r"^(?P<name>.+?)\s+(?P<us>[0-9.]+) us\s+(?P<tbps>[0-9.]+) TB/s\s+(?P<ratio>[0-9.]+)(?P<bad>\s+MISMATCH)?$")


def parse(text: str) -> dict[str, Any]:
    """``{"device", "shape", "rows": [{"group", "name", "us", "TBps", "ratio_memcpy", "mismatch"}]}``."""
    device, shape, group, rows = None, None, None, []
    for line in text.splitlines():
        line = line.rstrip()
        if line.startswith("device "):
            head, _, shape = line.partition("; ")
            device = head[len("device "):].split(",")[0]
        elif line.startswith("-- "):
            group = line[3:]
        elif (m := ROW.match(line)) is not None:
            rows.append({"group": group or "roofline", "name": m["name"].strip(), "us": float(m["us"]),
                         "TBps": float(m["tbps"]), "ratio_memcpy": float(m["ratio"]), "mismatch": bool(m["bad"])})
    if device is None or not rows:
        raise ValueError("not a row_copy printout: no 'device' line or no timed rows")
    return {"device": device, "shape": shape, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("txt")
    ap.add_argument("--commit", required=True)
    ap.add_argument("--command", required=True)
    ap.add_argument("--date", default=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    doc = {"date": a.date, "commit": a.commit, "command": a.command, **parse(Path(a.txt).read_text())}
    out = Path(a.out) if a.out else Path(a.txt).with_suffix(".json")
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out}: {len(doc['rows'])} rows, {sum(r['mismatch'] for r in doc['rows'])} mismatches")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
