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
import datetime
import json
import os
import re
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
MODULE_FLOOR = 15.0  # seconds: modules cheaper than this in every column are summed in one row


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


def started_at(path: Path) -> str | None:
    """When the run began, as its report says (`testsuite timestamp`, local time), in UTC."""
    suite = next(ET.parse(path).getroot().iter("testsuite"), None)  # noqa: S314
    stamp = suite.get("timestamp") if suite is not None else None
    if not stamp:
        return None
    when = datetime.datetime.fromisoformat(stamp)
    return when.astimezone(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")


def _module_path(classname: str) -> str:
    """`tests.host.test_agent.TestX` -> `tests/host/test_agent.py` (the longest existing file)."""
    parts = classname.split(".")
    for end in range(len(parts), 0, -1):
        candidate = "/".join(parts[:end]) + ".py"
        if (REPO / candidate).is_file():
            return candidate
    return "/".join(parts) + ".py"


def summarise(cases: list[Case], wall: float | None = None,
              prefetch: list[list[object]] | None = None) -> dict[str, object]:
    """Counts and seconds per tier and per module, the slowest tests, the run's wall time and
    what the background prefetch made (each step's seconds; near 0 when already cached)."""
    tiers: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    modules: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for case in cases:
        for table, key in ((tiers, case.tier), (modules, case.module)):
            table[key][0] += 1
            table[key][1] += case.seconds
    slowest = sorted(cases, key=lambda c: -c.seconds)[:SLOWEST]
    return {
        "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cores": os.cpu_count(), "load": round(os.getloadavg()[2], 2),
        "tests": len(cases), "seconds": round(sum(c.seconds for c in cases), 1),
        "wall minutes": round(wall / 60, 1) if wall is not None else "-",
        "prefetch": prefetch or [],
        "failed": sum(c.outcome in ("failed", "error") for c in cases),
        "tiers": {k: [int(v[0]), round(v[1], 1)] for k, v in sorted(tiers.items())},
        "modules": {k: [int(v[0]), round(v[1], 1)] for k, v in sorted(modules.items())},
        "slowest": [[f"{c.module}::{c.name}", round(c.seconds, 1)] for c in slowest],
    }


def render(data: dict[str, dict[str, object]]) -> str:
    """The markdown between the markers: one column per label, tiers then the slowest."""
    labels = sorted(data)
    lines = ["| measured | " + " | ".join(labels) + " |", "|---|" + "---|" * len(labels)]
    for what in ("measured", "cores", "load", "tests", "wall minutes", "seconds", "failed"):
        lines.append(f"| {what} | " + " | ".join(str(data[k].get(what, "-")) for k in labels)
                     + " |")
    tiers = sorted({t for k in labels for t in _dict(data[k], "tiers")})
    lines += ["", "| tier (tests, seconds) | " + " | ".join(labels) + " |",
              "|---|" + "---|" * len(labels)]
    for tier in tiers:
        cells = [_pair(_dict(data[k], "tiers").get(tier)) for k in labels]
        lines.append(f"| {tier} | " + " | ".join(cells) + " |")
    lines += ["", *_modules_table(data, labels), "", *_prefetch_table(data, labels)]
    for label in labels:
        lines += ["", f"The {SLOWEST} slowest tests ({label}):", ""]
        lines += [f"1. `{name}`: {seconds} s" for name, seconds in _list(data[label])]
    return "\n".join(lines)


def _modules_table(data: dict[str, dict[str, object]], labels: list[str]) -> list[str]:
    """Modules over MODULE_FLOOR seconds in some column, costliest first; the rest summed."""
    modules = {m for k in labels for m in _dict(data[k], "modules")}
    costly = sorted((m for m in modules if any(
        (_dict(data[k], "modules").get(m) or [0, 0.0])[1] >= MODULE_FLOOR for k in labels)),
        key=lambda m: -max((_dict(data[k], "modules").get(m) or [0, 0.0])[1] for k in labels))
    lines = [f"| module over {MODULE_FLOOR:.0f} s (tests, seconds) | " + " | ".join(labels)
             + " |", "|---|" + "---|" * len(labels)]
    for module in costly:
        cells = [_pair(_dict(data[k], "modules").get(module)) for k in labels]
        lines.append(f"| `{module}` | " + " | ".join(cells) + " |")
    rest = []
    for k in labels:
        others = [v for m, v in _dict(data[k], "modules").items() if m not in costly]
        rest.append(_pair([sum(v[0] for v in others), round(sum(v[1] for v in others), 1)]))
    lines.append(f"| {len(modules) - len(costly)} other modules | " + " | ".join(rest) + " |")
    return lines


def _prefetch_table(data: dict[str, dict[str, object]], labels: list[str]) -> list[str]:
    """What the background prefetch downloaded or compiled, per step, in seconds."""
    steps: list[str] = []
    for k in labels:
        for name, _ in _steps(data[k]):
            if name not in steps:
                steps.append(name)
    lines = ["| prefetched in the background (seconds) | " + " | ".join(labels) + " |",
             "|---|" + "---|" * len(labels)]
    for name in steps:
        cells = [str(dict(_steps(data[k])).get(name, "-")) for k in labels]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def _steps(entry: dict[str, object]) -> list[tuple[str, object]]:
    value = entry.get("prefetch")
    return [(str(a), b) for a, b in value] if isinstance(value, list) else []


def read_prefetch(log: Path) -> list[list[object]]:
    """The last prefetch's steps from its log: `prefetch: NAME: ready in N s` lines after
    the last `--- prefetch started` (a FAILED step is listed as such)."""
    if not log.is_file():
        return []
    text = log.read_text(errors="replace").rsplit("--- prefetch started", 1)[-1]
    found = re.findall(r"prefetch: (.+?): (ready in|FAILED after) (\d+) s", text)
    return [[name, int(sec) if how == "ready in" else f"FAILED {sec}"]
            for name, how, sec in found]


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
    parser.add_argument("--wall", type=float, help="with --from: the run's wall seconds")
    parser.add_argument("--load", type=float, help="with --from: the machine's load average "
                        "over the run [default: the 15-minute one now]")
    parser.add_argument("--prefetch-log", type=Path, help="the prefetch's log [default: the "
                        "test cache's prefetch.log]")
    parser.add_argument("pytest_args", nargs="*", help="after --: what pytest runs")
    args = parser.parse_args(argv)
    report, wall = args.source, args.wall
    if report is None:
        report = Path(tempfile.mkdtemp(prefix="test-cost-")) / "junit.xml"
        started = time.monotonic()
        subprocess.run([sys.executable, "-m", "pytest", "-q", f"--junitxml={report}",
                        *args.pytest_args], cwd=REPO, check=False)
        wall = time.monotonic() - started
    cache = Path(os.environ.get("GNI_TEST_CACHE")
                 or Path.home() / ".cache" / "gpu-node-installer-test")
    data = json.loads(DATA.read_text()) if DATA.is_file() else {}
    data[args.label] = summarise(read_junit(report), wall,
                                 read_prefetch(args.prefetch_log or cache / "prefetch.log"))
    data[args.label]["load"] = args.load if args.load is not None else round(
        os.getloadavg()[2], 2)
    data[args.label]["measured"] = started_at(report) or data[args.label]["measured"]
    DATA.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    write_page(render(data))
    print(render(data))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
