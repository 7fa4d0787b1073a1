"""IMEX=host: the package's `nvidia-imex`, run and supervised by the agent.

GB200/GB300 NVL72 nodes share GPU memory across the NVLink domain through NVIDIA's IMEX
service (NVIDIA's IMEX guide, docs.nvidia.com/multi-node-nvlink-systems/imex-guide: "Getting
Started", "IMEX Service Config Options"). It must be the loaded driver's version (it aborts
otherwise), reads `config.cfg`, and finds the domain's members in the file that
`IMEX_NODE_CONFIG_FILE` names. Here the staged config is copied into the agent's work area
with DAEMONIZE=0 (the agent supervises it in the foreground) and IMEX_NODE_CONFIG_FILE
pointing at a copy of the node's list (`IMEX_NODES_CONFIG`, read inside the host root), so
a link on the node can lead nowhere else. With IMEX=report (NVIDIA's DRA driver runs IMEX
per ComputeDomain) or off, nothing is started.
"""

from __future__ import annotations

from pathlib import Path

from installer.agent import fmconfig
from installer.agent.daemons import Spec
from installer.config import Config
from installer.errors import IncompatibleError
from installer.installdir.daemons import StagedDaemon
from installer.node.files import read_capped
from installer.node.host import Host, write_atomic
from installer.packages.daemons import IMEX

NODES_FIELD = "IMEX_NODE_CONFIG_FILE"
CONFIG_COPY = "nvidia-imex.cfg"
NODES_COPY = "nvidia-imex-nodes.cfg"
_MAX_CONFIG = 1024 * 1024


def imex_spec(config: Config, host: Host, staged: dict[str, StagedDaemon], *,
              driver_version: str, work: Path) -> tuple[Spec | None, str | None]:
    """The service to run under IMEX=host, else None; with a note when it is not run."""
    if config.imex != "host":
        return None, None
    imex = staged.get(IMEX)
    if imex is None or imex.version != driver_version:
        found = "carries no nvidia-imex" if imex is None else f"carries nvidia-imex {imex.version}"
        raise IncompatibleError(
            f"IMEX=host, but the driver package {driver_version} {found}; NVIDIA requires "
            "nvidia-imex of exactly the driver's version",
            remedy=f"rebuild the package with `package build ... --imex <nvidia-imex "
                   f"{driver_version} .deb>`, or set IMEX=report where NVIDIA's DRA driver "
                   "runs IMEX")
    nodes = _read(host.roots.node(config.imex_nodes_config))
    if not nodes.strip():
        return None, (f"IMEX=host but the IMEX domain's node list {config.imex_nodes_config} "
                      "is absent or empty: nvidia-imex not run (write one IP address a line "
                      "on every node of the domain, or set IMEX_NODES_CONFIG)")
    nodes_copy, config_copy = work / NODES_COPY, work / CONFIG_COPY
    write_atomic(nodes_copy, nodes.encode())
    text = _read(imex.config) if imex.config is not None else ""
    rendered = fmconfig.render(text, {}, {NODES_FIELD: str(nodes_copy)})
    if not any(line.startswith(f"{NODES_FIELD}=") for line in rendered.splitlines()):
        rendered += f"{NODES_FIELD}={nodes_copy}\n"
    write_atomic(config_copy, rendered.encode())
    return Spec(IMEX, (str(imex.binary), "-c", str(config_copy)), sha256=imex.sha256), None


def _read(path: Path) -> str:
    """A small config file's text, or "" when it is absent, unreadable or not a file."""
    try:
        return read_capped(path, _MAX_CONFIG).decode("utf-8", errors="replace")
    except OSError:
        return ""

