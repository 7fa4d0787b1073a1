"""`status`: one report of everything an operator asks first about a GPU node.

Read only. Detect's summary (the RDMA stack too), the package cache, the loaded modules
and why an optional one (nvidia-peermem, gdrdrv, nvidia-fs) is not, the staged versions,
readiness, an upgrade the Node's upgrade.skip label held back (`.skipped.json`), the last
verified run's stage timings (from `.state.json`), the node agent's view (its verdict,
each GPU's fabric state, its daemons), the CDI spec (where, which version it points at) and,
in the image, the digest of its SBOM.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from installer.agent import imexstate
from installer.agent.readiness import probe, read_view
from installer.compat import toolkit as compat
from installer.context import Context
from installer.installdir import cdifile, layout, migrecord, skipped
from installer.installdir.readiness import check_ready, ready_paths
from installer.installdir.state import MAX_STATE_BYTES
from installer.installdir.versions import current_name, previous_name, read_staged
from installer.node import kmod, optionalmods
from installer.node.facts import NodeInfo
from installer.packages.documents import DocumentError, read_document, read_file
from installer.pipeline import imagesbom


@dataclass(frozen=True)
class StatusReport:
    node: NodeInfo
    install_dir: str
    cache: dict[str, Any]
    modules: list[str]
    staged: dict[str, Any]
    readiness: dict[str, Any]
    last_run: dict[str, Any] | None
    upgrade: dict[str, Any] | None = None  # {"wanted", "serving", "skipped_by"}
    agent: dict[str, Any] | None = None  # the node agent's view (.agent.json), if it runs
    cdi: dict[str, Any] | None = None  # our CDI spec: path, version, intact
    mig: dict[str, Any] | None = None  # the partition stage's record (.mig.json)
    requested: dict[str, str] | None = None  # the version chosen now, and by which rule
    image: dict[str, Any] | None = None  # the image's version and SBOM digest (none: no image)
    optional: dict[str, Any] | None = None  # optional modules: loaded, or why not
    imex: dict[str, Any] | None = None  # IMEX's mode, channel device and nodes, its service

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node.to_dict(), "install_dir": self.install_dir,
                "cache": self.cache, "loaded_modules": self.modules, "staged": self.staged,
                "readiness": self.readiness, "upgrade": self.upgrade,
                "last_run": self.last_run, "agent": self.agent, "cdi": self.cdi,
                "mig": self.mig, "requested": self.requested, "image": self.image,
                "optional": self.optional, "imex": self.imex,
                "cuda": compat.cuda_support(self._driver())}

    def _driver(self) -> str | None:
        return self.node.loaded_driver.version if self.node.loaded_driver else None

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def to_text(self) -> str:
        staged = self.staged
        lines = [self.node.to_text(),
                 f"CUDA:            {compat.cuda_support_text(self._driver())}",
                 f"Loaded modules:  {', '.join(self.modules) or 'none'}",
                 *optional_lines(self.optional), *imexstate.status_line(self.imex),
                 f"Install dir:     {self.install_dir}",
                 f"Staged:          {staged['current'] or 'nothing'}"
                 f" (previous: {staged['previous'] or 'none'})",
                 f"Cache:           {self.cache['path']}: {self.cache['files']} files, "
                 f"{self.cache['bytes'] / 2**20:.1f} MiB; packages: "
                 f"{', '.join(self.cache['packages']) or 'none'}",
                 f"Ready:           {'yes' if self.readiness['ready'] else 'no'}: "
                 f"{self.readiness['reason']}"]
        if self.requested:
            lines.append(f"Requested:       {self.requested['version']} "
                         f"({self.requested['reason']})")
        if self.upgrade:
            lines.append(f"Upgrade:         wanted {self.upgrade['wanted']}, serving "
                         f"{self.upgrade['serving']}, skipped by label "
                         f"{self.upgrade['skipped_by']}")
        lines += agent_lines(self.agent)
        lines.append(cdi_line(self.cdi))
        lines += mig_lines(self.mig)
        image = imagesbom.image_line(self.image)
        if image:
            lines.append(image)
        if self.last_run:
            timings = self.last_run.get("timings_ms")
            shown = timings.items() if isinstance(timings, dict) else ()
            lines.append("Last run:        " + (", ".join(
                f"{name} {ms:.0f} ms" for name, ms in shown
                if isinstance(ms, int | float)) or "no timings"))
        return "\n".join(lines)


def collect(ctx: Context) -> StatusReport:
    """Gather the report (never raises for missing pieces: it says they are missing)."""
    root = ctx.install_root
    readiness = check_ready(ctx.config, ctx.host)
    env_file = ready_paths(ctx.config, ctx.host.roots)[1]
    return StatusReport(
        node=ctx.node_info(),
        install_dir=str(ctx.config.install_dir),
        cache=_cache(ctx),
        modules=_nvidia_modules(ctx),
        staged=_staged(root),
        readiness={"ready": readiness.ready, "reason": readiness.reason,
                   "document": readiness.document, "env_file": env_file.is_file()},
        last_run=_last_run(root),
        upgrade=skipped.current(ctx.config, ctx.host),
        agent=_agent(ctx),
        cdi=cdifile.describe(ctx.config, ctx.host.roots),
        mig=migrecord.read(root),
        requested=_requested(ctx),
        image=imagesbom.describe(),
        optional=_optional(ctx, readiness.document),
        imex=imexstate.describe(ctx.config, ctx.host),
    )


def _optional(ctx: Context, document: dict[str, Any] | None) -> dict[str, Any]:
    """nvidia-peermem, gdrdrv, nvidia-fs: loaded now, and the last install's word on each
    (`.ready.json`); gdrdrv and nvidia-fs only where an install decided them or they are
    loaded."""
    verdict = (document or {}).get("rdma")
    verdict = verdict if isinstance(verdict, dict) else {}
    report = {"nvidia_peermem": {
        "loaded": kmod.module_state(ctx.host, "nvidia_peermem") is not None,
        "reason": str(verdict.get("reason") or ""), "message": str(verdict.get("message")
                                                                   or "")}}
    listed = (document or {}).get("optional_modules")
    said = {str(v.get("module")): v for v in (listed if isinstance(listed, list) else [])
            if isinstance(v, dict)}
    for name in optionalmods.NAMES:
        loaded = kmod.module_state(ctx.host, name) is not None
        if name in said or loaded:
            entry = said.get(name, {})
            report[name] = {"loaded": loaded, "reason": str(entry.get("reason") or ""),
                            "message": str(entry.get("message") or ""),
                            "condition": optionalmods.CONDITIONS[name]}
    return report


def optional_lines(optional: dict[str, Any] | None) -> list[str]:
    """One line per optional module: loaded, or not and why (the install's reason)."""
    lines = []
    for name, entry in (optional or {}).items():
        state = "loaded" if entry.get("loaded") else "not loaded"
        why = (f" ({entry['reason']}: {entry['message']})" if entry.get("reason")
               else " (no install on record decided it)")
        lines.append(f"Optional:        {name.replace('_', '-')} {state}{why}")
    return lines


def _requested(ctx: Context) -> dict[str, str]:
    """The version DRIVER_VERSION_MAP (or the setting) chooses now; a map that cannot be
    applied is reported, not raised."""
    from installer.errors import InstallerError
    from installer.upgrade import versionmap

    try:
        return versionmap.choose(ctx.config).to_dict()
    except InstallerError as exc:
        return {"version": ctx.config.driver_version, "flavour": ctx.config.flavour,
                "rule": "error", "reason": f"map not applied: {exc.message}"}


def cdi_line(cdi: dict[str, Any] | None) -> str:
    """Where our CDI spec is and which staged version it points at."""
    if not cdi or not cdi.get("path"):
        return "CDI spec:        " + ("none written yet" if cdi and cdi.get("enabled")
                                      else "off (CDI=off)")
    state = "" if cdi.get("intact") else " (changed or removed since: not ours now)"
    return f"CDI spec:        {cdi['path']} -> {cdi.get('version')}{state}"


def mig_lines(mig: dict[str, Any] | None) -> list[str]:
    """The MIG layout per GPU as the partition stage left it (none: not configured)."""
    if mig is None:
        return ["MIG:             not configured"]
    lines = [f"MIG:             from {mig.get('source')}"]
    lines += [f"  GPU {gpu.get('index')} ({gpu.get('name')}): {migrecord.describe(gpu)}"
              for gpu in mig.get("gpus") or [] if isinstance(gpu, dict)]
    return lines


def _agent(ctx: Context) -> dict[str, Any] | None:
    """The agent's view with the probe's verdict on it (a stale view is not ready)."""
    view = read_view(ctx.config, ctx.host)
    if view is None:
        return None
    found = probe(ctx.config, ctx.host)
    return {**view, "ready": found.ready, "reason": found.reason}


def agent_lines(agent: dict[str, Any] | None) -> list[str]:
    """The agent's verdict, each GPU's fabric state and each daemon, one line each."""
    if agent is None:
        return ["Agent:           not running (no .agent.json)"]
    lines = [f"Agent:           {'ready' if agent.get('ready') else 'not ready'}: "
             f"{agent.get('reason', '')} (fabric: {agent.get('fabric_kind', 'unknown')})"]
    fabric = agent.get("fabric")
    for gpu in fabric if isinstance(fabric, list) else []:
        if isinstance(gpu, dict):
            status = f", status {gpu.get('status')}" if gpu.get("status") else ""
            lines.append(f"  GPU {gpu.get('index')}: fabric {gpu.get('state')}{status}")
    daemons = agent.get("daemons")
    for name, daemon in sorted(daemons.items()) if isinstance(daemons, dict) else []:
        if isinstance(daemon, dict):
            lines.append(f"  {name}: {daemon.get('state')} (pid {daemon.get('pid')}, "
                         f"restarts {daemon.get('restarts')})")
    return [*lines, next_kernel_line(agent)]


def next_kernel_line(agent: dict[str, Any]) -> str:
    """The kernel the node boots next and whether its driver is ready, as the agent said."""
    if "next_kernel" not in agent:
        return "Next kernel:     not watched (NEXT_KERNEL_PREPARE=off)"
    said = agent["next_kernel"]
    if not isinstance(said, dict):
        return "Next kernel:     none (no installed kernel newer than the running one)"
    return f"Next kernel:     {said.get('state')}: {said.get('message')}"


def _cache(ctx: Context) -> dict[str, Any]:
    """Size of the package cache and the packages it holds completely."""
    from installer.packages.cache import Cache

    node_path = ctx.config.cache_dir
    path = layout.cache_root(ctx.config, ctx.host.roots)
    files = [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else []
    packages = [f"{r.driver_version}-{r.kernel_release}-{r.flavour}"
                for r in (Cache(path).refs() if path.is_dir() else [])]
    return {"path": str(node_path or f"{ctx.config.install_dir}/{layout.CACHE_DIR}"),
            "files": len(files), "bytes": sum(p.stat().st_size for p in files),
            "packages": packages}


def _nvidia_modules(ctx: Context) -> list[str]:
    modules = kmod.loaded_modules(ctx.host) or []
    return [m.name for m in modules if m.name.startswith("nvidia")]


def _staged(root: Path) -> dict[str, Any]:
    current, previous = current_name(root), previous_name(root)
    versions = root / layout.VERSIONS
    names = sorted(p.name for p in versions.iterdir()
                   if p.is_dir() and not p.name.startswith(".")) if versions.is_dir() else []
    return {"current": current, "previous": previous, "versions": names,
            "meta": read_staged(root, current) if current else None}


def _last_run(root: Path) -> dict[str, Any] | None:
    """`.state.json` as written, for display (bounded reader); None when absent, malformed
    or not a regular file: status reports, it does not fail."""
    path = root / layout.STATE_FILE
    try:
        data = read_file(path, MAX_STATE_BYTES)
        return None if data is None else read_document(
            data, name=layout.STATE_FILE, source=str(path), limit=MAX_STATE_BYTES)
    except DocumentError:
        return None
