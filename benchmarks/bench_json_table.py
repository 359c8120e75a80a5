"""Turns ``pytest benchmarks/ --benchmark-json FILE`` output into the Markdown table that
docs/benchmarks.md records: per benchmark the median per operation in ns and the ratio to its
group's baseline, with the machine and commit of the run.

Run: ``python benchmarks/bench_json_table.py FILE.json``.
"""
from __future__ import annotations

import json
import sys

from _common import per_op_table


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        data = json.load(f)
    info = data.get("machine_info", {})
    cpu = info.get("cpu", {}).get("brand_raw") or info.get("processor") or "?"
    commit = data.get("commit_info", {}).get("id", "?")[:10]
    print(f"Machine: {cpu}, {info.get('cpu', {}).get('count', '?')} cores, "
          f"{info.get('system', '?')} {info.get('release', '')}, Python "
          f"{info.get('python_version', '?')}; commit {commit}; {data.get('datetime', '?')}\n")
    print(per_op_table(data.get("benchmarks", [])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
