"""The CDI spec's one hook: a createContainer hook, shipped in the install dir, that adds
the driver's libraries to the container's linker cache.

Why: setting LD_LIBRARY_PATH in the spec replaces an image's own value (`ENV
LD_LIBRARY_PATH=/opt/own/lib`, or a user's `-e`). NVIDIA's spec instead runs
`nvidia-cdi-hook update-ldcache` (nvidia-container-toolkit
cmd/nvidia-cdi-hook/update-ldcache/update-ldcache.go and internal/ldconfig/ldconfig.go @
d34b3046): it reads the OCI state on stdin, takes the container's root from the bundle's
config.json (`root.path`, relative to the bundle when not absolute) and runs the host's
ldconfig in that root with the driver's folder added. This hook does the same with what
every node has, `/bin/sh`, `sed` and the host's static `ldconfig`, and no NVIDIA toolkit:
`ldconfig -r <root>` chroots into the container's root before it reads or writes anything
(so a hostile image's symlinks resolve inside it), `-X` leaves the read-only library mount's
links alone, and the folder is given on the command line (nothing else is written into the
image: a later ldconfig in the container drops it, as it would an unlisted folder).

The hook never fails a container: a root it cannot find or an ldconfig that fails is one
line on stderr and exit 0 (the container then starts as it would without the cache; an
image that sets LD_LIBRARY_PATH to the folder, as NVIDIA's CUDA images do, still works).
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from installer.installdir.layout import CDI_HOOK
from installer.node.host import write_atomic

HOOK_FILE = CDI_HOOK  # in the install dir, beside `.versions/`
HOOK_NAME = "createContainer"

_SCRIPT = r"""#!/bin/sh
# gpu-node-installer: CDI createContainer hook. Adds FOLDER to the container's linker cache
# (as nvidia-cdi-hook update-ldcache does); never fails the container.
folder=${1:-/usr/local/nvidia/lib64}
say() { echo "gpu-node-installer cdi hook: $*; linker cache not updated" >&2; exit 0; }
one_line() { tr '\n\r\t' '   ' | head -c 4194304; }
bundle=$(head -c 65536 | one_line |
    sed -n 's/.*"bundle"[[:space:]]*:[[:space:]]*"\([^"\\]*\)".*/\1/p')
[ -n "$bundle" ] && [ -f "$bundle/config.json" ] || say "no bundle in the container state"
s='[[:space:]]*'
root=$(one_line < "$bundle/config.json" |
    sed -n "s/.*\"root\"$s:$s{[^}]*\"path\"$s:$s\"\\([^\"\\\\]*\\)\".*/\\1/p")
case $root in
    "") say "no root.path in $bundle/config.json" ;;
    /*) ;;
    *) root=$bundle/$root ;;
esac
[ "$root" != / ] && [ -d "$root" ] || say "container root $root is not a directory"
for ldconfig in /sbin/ldconfig /usr/sbin/ldconfig /usr/bin/ldconfig; do
    if [ -x "$ldconfig" ]; then
        "$ldconfig" -X -r "$root" "$folder" >&2 || say "$ldconfig failed in $root"
        exit 0
    fi
done
say "no ldconfig on the node"
"""


def script() -> str:
    return _SCRIPT


def hook_entry(install_dir: PurePosixPath, folder: PurePosixPath) -> dict[str, object]:
    """The spec's hook: the script at its node path, the folder as its argument."""
    path = install_dir / HOOK_FILE
    return {"hookName": HOOK_NAME, "path": str(path), "args": [HOOK_FILE, str(folder)]}


def ensure(install_root: Path) -> None:
    """Write the script (0755) unless it is already there byte for byte."""
    path = install_root / HOOK_FILE
    data = _SCRIPT.encode()
    try:
        if not path.is_symlink() and path.is_file() and path.read_bytes() == data \
                and path.stat().st_mode & 0o777 == 0o755:
            return
    except OSError:
        pass
    write_atomic(path, data, mode=0o755)


def remove(install_root: Path) -> None:
    """With our spec gone, its hook goes too (a symlink at its name: the link only)."""
    (install_root / HOOK_FILE).unlink(missing_ok=True)
