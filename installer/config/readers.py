"""Which commands read which settings: the `commands` column of the SETTINGS table.

A command's `--help` shows only the settings it reads (the others stay accepted, hidden, so
no script breaks); docs/reference.md lists the readers of each setting. The groups follow
the code paths: every node command builds its Context from the roots and the log settings;
the commands that take the install dir's lock check the install and cache dirs; the ones
that get a package resolve the version (DRIVER_VERSION_MAP reads the Node's labels).
"""

from __future__ import annotations

NODE = frozenset({
    "agent", "cdi", "check-pod", "compat", "detect", "fetch", "install", "load", "partition",
    "prepare", "signal", "stage", "status", "uninstall", "unload", "verify", "versions",
    "wait-ready"})
FETCHING = frozenset({"fetch", "install", "load", "prepare", "stage", "versions"})
LOCKED = frozenset({"fetch", "install", "load", "partition", "signal", "stage",
                    "uninstall", "unload"})
INSTALL_DIR = NODE - {"compat", "detect"}
KUBE = FETCHING | {"agent", "install", "partition", "signal", "status"}
CDI = LOCKED | {"cdi", "status"}
LOADING = frozenset({"install", "load"})
STAGING = frozenset({"install", "partition", "stage"})
SIGNALLING = frozenset({"install", "signal"})
UPGRADE = frozenset({"install", "partition"})
MIG = frozenset({"install", "partition"})
AGENT = frozenset({"agent"})
DAEMONS = frozenset({"agent", "install"})
IMEX = LOADING | DAEMONS | {"status"}  # channel nodes at load, the service in the agent
CACHE = LOCKED | {"prepare", "status", "versions"}
RESOLVING = FETCHING | {"status", "preflight"}
LABELS = SIGNALLING | {"check-pod"}
VERIFYING = frozenset({"agent", "install", "signal", "verify"})
# `preflight` reads no node: the version rules, the mirrors and downloads, the API (Events,
# the Node list) and the log settings
PREFLIGHT = frozenset({"preflight"})
DOWNLOADING = FETCHING | PREFLIGHT
KUBE_API = KUBE | PREFLIGHT
LOGS = NODE | PREFLIGHT
