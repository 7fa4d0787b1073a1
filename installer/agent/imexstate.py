"""What `status` shows of IMEX (agent.imex runs it): kept apart from the service's start so
that `status` imports nothing of the agent's supervision."""

from __future__ import annotations

from typing import Any

from installer.config import Config
from installer.installdir.daemons import staged_daemons
from installer.node import kmod
from installer.node.host import Host
from installer.packages.daemons import IMEX


def describe(config: Config, host: Host) -> dict[str, Any]:
    """What `status` shows of IMEX: the mode, whether the loaded driver has the channel
    device (`/proc/devices`), the channel nodes on the node, the package's nvidia-imex."""
    major = kmod.char_majors(host).get(kmod.IMEX_CHANNELS)
    channels_dir = host.roots.dev / kmod.IMEX_CHANNELS
    try:
        channels = sorted(p.name for p in channels_dir.iterdir()) if channels_dir.is_dir() else []
    except OSError:
        channels = []
    staged = staged_daemons(config, host.roots).get(IMEX)
    return {"mode": config.imex, "driver_device_major": major, "channels": channels,
            "package_imex": staged.version if staged is not None else None}


def status_line(state: dict[str, Any] | None) -> list[str]:
    """One human line for `status`, only when IMEX is in play (a mode other than report, a
    driver with channels, or a package that carries it)."""
    if not state or not (state.get("mode") != "report" or state.get("driver_device_major")
                         is not None or state.get("package_imex")):
        return []
    channels = ", ".join(state.get("channels") or []) or "no channel nodes"
    device = ("driver has no IMEX channel device" if state.get("driver_device_major") is None
              else f"channels: {channels}")
    service = (f"package nvidia-imex {state['package_imex']}" if state.get("package_imex")
               else "the package has no nvidia-imex")
    return [f"IMEX:            IMEX={state.get('mode')}; {device}; {service}"]
