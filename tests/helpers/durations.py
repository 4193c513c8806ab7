"""Where `make test`'s time goes: the seconds of each test file (and each xdist group) in the JUnit files the run
leaves (``test-artifacts/junit-parallel.xml``, ``junit-serial.xml``), longest first.

    .venv/bin/python -m tests.helpers.durations [test-artifacts/junit-parallel.xml ...] [--top 30]
"""

from __future__ import annotations

import argparse
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

DEFAULT = ("test-artifacts/junit-parallel.xml", "test-artifacts/junit-serial.xml")


def per_file(paths) -> dict[str, tuple[int, float]]:
    """File (and group, after ``@``) -> (tests, seconds) over the JUnit files."""
    out: dict[str, list] = defaultdict(lambda: [0, 0.0])
    for path in paths:
        for case in ET.parse(path).getroot().iter("testcase"):
            name = case.get("classname", "").replace(".", "/") + ".py"
            group = case.get("name", "").rpartition("@")[2] if "@" in case.get("name", "") else ""
            key = name + (f" @{group}" if group and not group.endswith(".py") else "")
            out[key][0] += 1
            out[key][1] += float(case.get("time", 0))
    return {k: (n, s) for k, (n, s) in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", default=[p for p in DEFAULT if Path(p).exists()])
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args()
    rows = sorted(per_file(args.files).items(), key=lambda kv: -kv[1][1])
    total = sum(s for _, (_, s) in rows)
    print(f"{'file':60s} {'tests':>5s} {'seconds':>8s} {'share':>6s}")
    for name, (n, s) in rows[:args.top]:
        print(f"{name[:60]:60s} {n:5d} {s:8.1f} {s / total:6.1%}")
    print(f"{'all ' + str(len(rows)) + ' files':60s} {sum(n for _, (n, _) in rows):5d} {total:8.1f}")


if __name__ == "__main__":
    main()
