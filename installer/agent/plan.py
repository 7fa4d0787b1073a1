"""Which daemons this node needs, from the node itself and the staged package.

Each daemon's argv[0] is its staged binary and its Spec carries the binary's sha256 from
the stage's record: the supervisor hashes the file against it before every start.
Refusals happen here, before anything starts: a fabric node whose package lacks Fabric
Manager (or NVLSM), or carries a Fabric Manager of another version than the driver, is
exit 14 (`require_daemons`), as is IMEX=host without nvidia-imex of the driver's version
(`agent.imex`); a bad `NVFM_CONFIG_*` is exit 2. With FABRIC_MANAGER=host the
node's own OS runs them: the agent starts neither and still waits for the fabric.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from installer.agent import fmconfig
from installer.agent.daemons import Spec, persistenced_spec
from installer.agent.imex import imex_spec
from installer.config import Config
from installer.installdir.daemons import StagedDaemon, require_daemons, staged_daemons
from installer.installdir.layout import install_root
from installer.node.fabric import FabricKind, fabric_kind
from installer.node.files import read_capped
from installer.node.host import Host, write_atomic

FM_CONFIG_COPY = "fabricmanager.cfg"
_MAX_FM_CONFIG = 1024 * 1024  # the shipped config is a few KiB
PATH_FIELDS = ("TOPOLOGY_FILE_PATH", "DATABASE_PATH")  # /usr/share/nvidia/nvswitch upstream


@dataclass(frozen=True)
class Plan:
    """The node's fabric kind, the daemons to run in start order, and their environment."""

    kind: FabricKind
    specs: tuple[Spec, ...]
    notes: tuple[str, ...]
    env: dict[str, str]

    @property
    def fabric(self) -> bool:
        return self.kind != "none"


def make_plan(config: Config, host: Host, *, driver_version: str, work: Path,
              environ: Mapping[str, str]) -> Plan:
    """Decide the daemons; write Fabric Manager's config copy into the work area."""
    overrides = fmconfig.overrides_from_env(environ)
    kind = fabric_kind(host)
    staged = staged_daemons(config, host.roots)
    specs: list[Spec] = []
    notes: list[str] = []
    if config.persistence_mode == "on":
        persistenced = staged.get("nvidia-persistenced")
        if persistenced is None:
            notes.append("the package has no nvidia-persistenced: persistence mode not run")
        else:
            specs.append(persistenced_spec(config, persistenced.binary, driver_version,
                                           persistenced.sha256))
    else:
        notes.append("PERSISTENCE_MODE=off: nvidia-persistenced not run")
    if kind != "none" and config.fabric_manager == "host":
        notes.append("FABRIC_MANAGER=host: the node runs Fabric Manager; the agent only "
                     "waits for the fabric")
    elif kind != "none":
        require_daemons(kind, staged, driver_version)
        fm_config = _fm_config(staged["nv-fabricmanager"], overrides, work)
        if kind == "nvlink5":
            nvlsm = staged["nvlsm"]
            argv = [str(nvlsm.binary)] + (["-F", str(nvlsm.config)] if nvlsm.config else [])
            specs.append(Spec("nvlsm", tuple(argv), needs_ib=True, sha256=nvlsm.sha256))
        fm = staged["nv-fabricmanager"]
        specs.append(Spec("nv-fabricmanager", (str(fm.binary), "-c", str(fm_config)),
                          needs_ib=kind == "nvlink5", sha256=fm.sha256))
    elif overrides:
        notes.append("NVFM_CONFIG_* set but this node has no NVSwitch: ignored")
    imex, note = imex_spec(config, host, staged, driver_version=driver_version, work=work)
    specs += [imex] if imex is not None else []
    notes += [note] if note is not None else []
    return Plan(kind, tuple(specs), tuple(notes), daemon_env(config, host, environ))


def daemon_env(config: Config, host: Host, environ: Mapping[str, str]) -> dict[str, str]:
    """The agent's environment, with the staged driver libraries first on the daemons'
    library path: they load libnvidia-ml and friends, which live in the install dir here."""
    lib64 = str(install_root(config, host.roots) / "lib64")
    path = environ.get("LD_LIBRARY_PATH", "")
    return {**environ, "LD_LIBRARY_PATH": f"{lib64}:{path}" if path else lib64}


def _fm_config(fm: StagedDaemon, overrides: Mapping[str, str], work: Path) -> Path:
    """The staged config with the overrides, written to the work area (the staged file is
    never edited: it belongs to the version directory)."""
    text = ""
    if fm.config is not None:
        try:
            text = read_capped(fm.config, _MAX_FM_CONFIG).decode("utf-8", errors="replace")
        except OSError:  # absent, unreadable, or not a regular file
            text = ""
    # the topology files and database sit beside the staged config, not in /usr/share
    beside = {} if fm.config is None else {key: str(fm.config.parent) for key in PATH_FIELDS}
    copy = work / FM_CONFIG_COPY
    write_atomic(copy, fmconfig.render(text, overrides, beside).encode())
    return copy
