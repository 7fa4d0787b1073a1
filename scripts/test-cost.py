#!/usr/bin/env python3
"""What the test suite costs, per tier and per module, measured from a real run.

    .venv/bin/python scripts/test-cost.py --label warm [-- PYTEST ARGS]
    .venv/bin/python scripts/test-cost.py --label cold --from run.xml

Runs pytest with a JUnit XML report (or reads one a run already wrote, `--from`), adds up the
seconds per tier (the first folder under tests/) and per module, keeps them in
docs/test-cost.json under the label (warm, cold, rebuild: one column each), and rewrites the
table between the markers in docs/testing.md, with the date, the machine's cores and its load
average when measured, and the 20 slowest tests. A label measured again replaces its column;
the others stay, so the cold figure (a fresh clone with an empty cache) and the warm one can be
measured on different days and read side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "docs" / "test-cost.json"
PAGE = REPO / "docs" / "testing.md"
BEGIN, END = "<!-- test-cost:begin -->", "<!-- test-cost:end -->"
SLOWEST = 20


@dataclass(frozen=True)
class Case:
    """One test as the JUnit report has it."""

    module: str  # tests/host/test_agent.py
    name: str
    seconds: float
    outcome: str  # passed, failed, error, skipped

    @property
    def tier(self) -> str:
        parts = self.module.split("/")
        return parts[1] if len(parts) > 2 else "(top)"


def read_junit(path: Path) -> list[Case]:
    """Every test case of a pytest JUnit XML report, its module as a repository path."""
    cases = []
    for element in ET.parse(path).getroot().iter("testcase"):  # noqa: S314
        classname = element.get("classname", "")
        module = _module_path(classname)
        outcome = next((child.tag for child in element
                        if child.tag in ("failure", "error", "skipped")), "passed")
        cases.append(Case(module, element.get("name", ""), float(element.get("time", "0")),
                          {"failure": "failed"}.get(outcome, outcome)))
    return cases


def _module_path(classname: str) -> str:
    """`tests.host.test_agent.TestX` -> `tests/host/test_agent.py` (the longest existing file)."""
    parts = classname.split(".")
    for end in range(len(parts), 0, -1):
        candidate = "/".join(parts[:end]) + ".py"
        if (REPO / candidate).is_file():
            return candidate
    return "/".join(parts) + ".py"


def summarise(cases: list[Case]) -> dict[str, object]:
    """Counts and seconds per tier and per module, and the slowest tests."""
    tiers: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    modules: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for case in cases:
        for table, key in ((tiers, case.tier), (modules, case.module)):
            table[key][0] += 1
            table[key][1] += case.seconds
    slowest = sorted(cases, key=lambda c: -c.seconds)[:SLOWEST]
    return {
        "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cores": os.cpu_count(), "load": round(os.getloadavg()[0], 2),
        "tests": len(cases), "seconds": round(sum(c.seconds for c in cases), 1),
        "failed": sum(c.outcome in ("failed", "error") for c in cases),
        "tiers": {k: [int(v[0]), round(v[1], 1)] for k, v in sorted(tiers.items())},
        "modules": {k: [int(v[0]), round(v[1], 1)] for k, v in sorted(modules.items())},
        "slowest": [[f"{c.module}::{c.name}", round(c.seconds, 1)] for c in slowest],
    }


def render(data: dict[str, dict[str, object]]) -> str:
    """The markdown between the markers: one column per label, tiers then the slowest."""
    labels = sorted(data)
    lines = ["| measured | " + " | ".join(labels) + " |", "|---|" + "---|" * len(labels)]
    for what in ("measured", "cores", "load", "tests", "seconds", "failed"):
        lines.append(f"| {what} | " + " | ".join(str(data[k][what]) for k in labels) + " |")
    tiers = sorted({t for k in labels for t in _dict(data[k], "tiers")})
    lines += ["", "| tier (tests, seconds) | " + " | ".join(labels) + " |",
              "|---|" + "---|" * len(labels)]
    for tier in tiers:
        cells = [_pair(_dict(data[k], "tiers").get(tier)) for k in labels]
        lines.append(f"| {tier} | " + " | ".join(cells) + " |")
    for label in labels:
        lines += ["", f"The {SLOWEST} slowest tests ({label}):", ""]
        lines += [f"1. `{name}`: {seconds} s" for name, seconds in _list(data[label])]
    return "\n".join(lines)


def _dict(entry: dict[str, object], key: str) -> dict[str, list[float]]:
    value = entry.get(key)
    return value if isinstance(value, dict) else {}


def _list(entry: dict[str, object]) -> list[list[object]]:
    value = entry.get("slowest")
    return value if isinstance(value, list) else []


def _pair(value: list[float] | None) -> str:
    return "-" if not value else f"{int(value[0])}, {value[1]} s"


def write_page(table: str, page: Path | None = None) -> None:
    """Replace the text between the markers (they must be there once each)."""
    page = page or PAGE
    text = page.read_text()
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    page.write_text(text[:start] + "\n" + table + "\n" + text[end:])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", required=True, help="the column: warm, cold, rebuild ...")
    parser.add_argument("--from", dest="source", type=Path, help="a JUnit XML report to read")
    parser.add_argument("pytest_args", nargs="*", help="after --: what pytest runs")
    args = parser.parse_args(argv)
    report = args.source
    if report is None:
        report = Path(tempfile.mkdtemp(prefix="test-cost-")) / "junit.xml"
        subprocess.run([sys.executable, "-m", "pytest", "-q", f"--junitxml={report}",
                        *args.pytest_args], cwd=REPO, check=False)
    data = json.loads(DATA.read_text()) if DATA.is_file() else {}
    data[args.label] = summarise(read_junit(report))
    DATA.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    write_page(render(data))
    print(render(data))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
