"""`preflight`'s answer: one row per (kernel, arch, pool), the lifecycle warnings, and the
`package build` command that would make each missing package."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from installer.compat.lifecycle import Finding
from installer.errors import IncompatibleError

READY, MISSING, UNSUPPORTED = "ready", "missing", "unsupported"
_DEBIAN_KERNEL = re.compile(r"^\d+\.\d+\.\d+-\d+(\+deb\d+)?-(cloud-|rt-)?(amd64|arm64)$")


@dataclass
class Row:
    """One target's answer."""

    kernel: str
    arch: str
    pool: str
    requested: str  # the version request (setting, map entry, override label)
    rule: str  # which rule chose it, as DRIVER_VERSION_MAP says
    gpu: str | None = None
    nodes: tuple[str, ...] = ()
    driver: str | None = None  # the resolved version; for a missing one, the wanted one
    flavour: str | None = None
    source: str | None = None  # the mirror (or cos build) that holds it
    state: str = MISSING
    reason: str = ""
    build: str | None = None
    findings: list[Finding] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"kernel": self.kernel, "arch": self.arch, "pool": self.pool,
                "gpu": self.gpu, "nodes": list(self.nodes), "requested": self.requested,
                "rule": self.rule, "driver": self.driver, "flavour": self.flavour,
                "source": self.source, "state": self.state, "reason": self.reason or None,
                "build_command": self.build,
                "findings": [f.to_dict() for f in self.findings]}


@dataclass
class Report:
    """Every row, and whether the fleet is served (warnings fail too with `strict`)."""

    rows: list[Row]
    today: str
    strict: bool = False
    events: list[str] = field(default_factory=list)  # what --post-events did, one line each

    @property
    def warnings(self) -> list[dict[str, str]]:
        return [{"kernel": r.kernel, "arch": r.arch, "pool": r.pool, "driver": r.driver or "",
                 **f.to_dict()} for r in self.rows for f in r.findings if f.level == "warning"]

    @property
    def failing(self) -> list[Row]:
        return [r for r in self.rows if r.state != READY]

    @property
    def ok(self) -> bool:
        return not self.failing and not (self.strict and self.warnings)

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "strict": self.strict, "date": self.today,
                "rows": [r.to_dict() for r in self.rows], "warnings": self.warnings,
                "events": self.events}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def to_text(self) -> str:
        head = ("KERNEL", "ARCH", "POOL", "DRIVER", "SOURCE", "STATE")
        table = [head, *((r.kernel, r.arch, _pool(r), _driver(r), r.source or "-", r.state)
                         for r in self.rows)]
        widths = [max(len(row[i]) for row in table) for i in range(len(head))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
                 for row in table]
        for row in self.failing:
            lines.append(f"{row.state}: {row.kernel} {row.arch} pool {_pool(row)}: {row.reason}")
            if row.build:
                lines.append(f"  make it: {row.build}")
        for row in self.rows:
            for finding in row.findings:
                if finding.level == "warning":
                    lines.append(f"warning: {row.kernel} {row.arch} pool {_pool(row)}: "
                                 f"{finding.message}")
        lines.extend(self.events)
        verdict = "every target is served" if self.ok else (
            f"{len(self.failing)} of {len(self.rows)} not served" if self.failing
            else "warnings fail under --strict")
        lines.append(f"preflight ({self.today}): {verdict}")
        return "\n".join(lines)

    def log_fields(self) -> dict[str, Any]:
        return {"rows": len(self.rows), "failing": len(self.failing),
                "warnings": len(self.warnings), "ok": self.ok}

    def raise_if_failed(self) -> None:
        """IncompatibleError (exit 14) naming what is not served, or the warnings under
        --strict."""
        if self.ok:
            return
        if self.failing:
            first = self.failing[0]
            more = f" (and {len(self.failing) - 1} more)" if len(self.failing) > 1 else ""
            raise IncompatibleError(
                f"preflight: kernel {first.kernel} {first.arch} (pool {first.pool}"
                f"{f', {len(first.nodes)} nodes' if len(first.nodes) > 1 else ''}) has "
                f"no driver: {first.state}, {first.reason}{more}",
                remedy=(f"run `{first.build}` and publish it to the mirror" if first.build
                        else "pick a driver version that serves every target"))
        warning = self.warnings[0]
        raise IncompatibleError(f"preflight --strict: {warning['message']}",
                                remedy="move to a supported driver branch (see "
                                       "docs/operating.md), or drop --strict")


def _pool(row: Row) -> str:
    return row.pool + (f" ({len(row.nodes)} nodes)" if len(row.nodes) > 1 else "")


def _driver(row: Row) -> str:
    if row.driver is None:
        return f"{row.requested} -> ?"
    text = f"{row.driver} {row.flavour or ''}".rstrip()
    return text if row.state == READY else f"{text} (needed)"


def build_command(kernel: str, arch: str, version: str, flavour: str) -> str:
    """The `package build` line that makes the package: NVIDIA's runfile of that version,
    the kernel's headers (from Debian's archive where the release is Debian's)."""
    if _DEBIAN_KERNEL.match(kernel):
        headers = f"--kernel-headers-from-apt linux-headers-{kernel}"
    else:
        headers = f"--kernel-headers linux-headers-{kernel}"
    return (f"gpu-node-installer package build --nvidia-source "
            f"NVIDIA-Linux-{arch}-{version}.run {headers} --flavour {flavour} "
            f"--arch {arch} --repo ./repo")
