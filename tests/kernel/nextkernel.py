"""Two of Debian's real kernels and a reboot between them, for tests/kernel/test_next_kernel.py
and benchmarks/next_kernel.py.

OLD is bookworm's previous ABI (6.1.0-56-amd64, its image extracted by the tier's assets),
NEW the tier's kernel (6.1.0-57-amd64): two real kernels with different vermagic, so modules
built for one do not load on the other, and both compile with the host's gcc-12 and bookworm's
kbuild (trixie's 6.12 needs its own glibc's kbuild tools, which the guest root lacks).

The node's disk is what persists across the reboot: its /home/kubernetes (install dir, host
cache) is a tar the first boot writes into its out dir and the next boot unpacks before
anything runs, onto the guest's own filesystem (a tmpfs overlay, as a node's local disk, not
9p). The mirror is `python -m http.server` on the guest's loopback: its access log says
whether a boot downloaded anything. Each boot unpacks NEW's real headers .debs as dpkg lays
them out (the build link under /lib/modules/NEW included), so a compile is possible in both
and its absence after the preparation means something.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from native import build_standins
from native.packages import standin_tree
from nvsources import mini_source

from installer.packages.builder import BuildRequest, build

from . import assets, guest
from .assets import Kernel

REPO = Path(__file__).resolve().parents[2]
OLD_RELEASE = "6.1.0-56-amd64"
VERSION = "535.261.03"
PORT = 8089
INSTALL_DIR = "/home/kubernetes/bin/nvidia"
MEMORY_MB = 4096

# The node's settings as the DaemonSet's env gives them to install and to the agent's prepare.
NODE_ENV = {
    "HOST_ROOT": "/", "PROC_ROOT": "/proc", "SYS_ROOT": "/sys", "DEV_ROOT": "/dev",
    "LOG_FORMAT": "json", "NVIDIA_DRIVER_VERSION": VERSION, "BUILD_FALLBACK": "auto",
    "DRIVER_MIRRORS": f"http://127.0.0.1:{PORT}", "DRIVER_ALLOW_HTTP": "true",
    "TERMINATION_LOG": "/tmp/termination-log",
}

# Shared by both boots: the simulated GPU, loopback, the disk, NEW's headers, the mirror.
PRELUDE = r"""
set -e
up() {{ cut -d' ' -f1 /proc/uptime; }}
up > "$GNI_OUT/script-start"
{fake_gpu}
ip link set lo up
mkdir -p /home/kubernetes
if [ -n "$DISK" ]; then tar -xpf "$DISK" -C /home/kubernetes; fi
if [ -n "$NEW_MODULES" ]; then  # the image package's tree, as installed beside the running one
  mkdir -p "/lib/modules/$NEW"; mount --bind "$NEW_MODULES" "/lib/modules/$NEW"
fi
for deb in $NEW_HEADERS; do
  dpkg-deb --fsys-tarfile "$deb" | tar -x --keep-directory-symlink -C /
done
readlink "/lib/modules/$NEW/build" > "$GNI_OUT/build-link"
"$PY" -m http.server {port} --bind 127.0.0.1 --directory "$MIRROR" 2> "$GNI_OUT/mirror.log" &
for i in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/{port}) 2>/dev/null && break; sleep 0.1; done
snapshot() {{  # the install dir but its cache, prepare's lock, the agent's view and work area
  (cd {install_dir} && find . -mindepth 1 \( -path ./.cache -o -path ./.prepare.lock \
     -o -path ./.agent -o -path ./.agent.json \) -prune -o -printf '%p %y %s %T@ %l\n' | sort)
}}
set +e
up > "$GNI_OUT/install-start"
"$PY" -m installer install --output json > "$GNI_OUT/install.json" 2> "$GNI_OUT/install.log"
echo $? > "$GNI_OUT/install.rc"
up > "$GNI_OUT/ready"
uname -r > "$GNI_OUT/release"
cut -d' ' -f1 /proc/modules | sort > "$GNI_OUT/modules"
"""

# Boot 1 (OLD): installed and ready, then NEW prepared: by the command line the agent runs
# (the benchmark), or by the node agent itself, which sees NEW's tree and prepares it.
OLD_BOOT = r"""
snapshot > "$GNI_OUT/dir-before"
tar -C /home/kubernetes -cf "$GNI_OUT/disk-unprepared.tar" .
{prepare}
cut -d' ' -f1 /proc/modules | sort > "$GNI_OUT/modules-after"
cp -r {install_dir}/.cache/refs "$GNI_OUT/refs"  # the host cache's packages, by digest
snapshot > "$GNI_OUT/dir-after"
ls {install_dir}/.versions > "$GNI_OUT/versions"
tar -C /home/kubernetes -cf "$GNI_OUT/disk.tar" .
"""

PREPARE_COMMAND = r"""
nice -n 19 ionice -c 3 "$PY" -m installer prepare --kernel "$NEW" -o json \
  > "$GNI_OUT/prepare.json" 2> "$GNI_OUT/prepare.log"
echo $? > "$GNI_OUT/prepare.rc"
"""

# The agent as the DaemonSet runs it (no API here: its view says the next kernel), until
# it says NEW ready, missing or failed; then stopped as the kubelet stops it.
PREPARE_BY_AGENT = r"""
METRICS_PORT=0 "$PY" -m installer agent > "$GNI_OUT/agent.log" 2>&1 &
AGENT=$!
"$PY" - {install_dir}/.agent.json {wait_s} > "$GNI_OUT/agent-view.json" <<'EOF'
import json, sys, time
path, end, view = sys.argv[1], time.monotonic() + float(sys.argv[2]), {{}}
while time.monotonic() < end:
    try:
        view = json.load(open(path))
    except (OSError, ValueError):
        view = {{}}
    if (view.get("next_kernel") or {{}}).get("state") in ("ready", "missing", "failed"):
        break
    time.sleep(1)
print(json.dumps(view))
EOF
kill -TERM $AGENT; wait $AGENT; echo $? > "$GNI_OUT/agent.rc"
cp {install_dir}/.agent/prepare.log "$GNI_OUT/prepare.log"
"""

# Boot 2 (NEW): the install alone; the mirror's log tells whether it downloaded.
NEW_BOOT = r"""
ls {install_dir}/.versions > "$GNI_OUT/versions"
"""


def old_kernel() -> Kernel:
    """bookworm's 6.1.0-56-amd64 image, extracted and depmod'ed (cached by the tier)."""
    return assets.ensure_kernel(OLD_RELEASE)


def make_repo(work: Path) -> Path:
    """The node's mirror: OLD's package compiled on the host from the stand-in sources and
    OLD's real headers .debs (`package build --kernel-headers`), and a source package of the
    same sources, nothing for NEW: only a build from NEW's headers makes NEW's package."""
    sources = mini_source(work / "nvidia-src", VERSION)
    with (sources / "Kbuild").open("a") as kbuild:  # reads like the open flavour, as it is
        kbuild.write("ccflags-y += -DGNI_OPEN_FLAVOUR\n")
    tree = standin_tree(work / "user", build_standins(work / "built"), VERSION)
    repo = work / "repo"
    build(BuildRequest(trees=(tree,), nvidia_source=sources, repo=repo,
                       kernel_headers=tuple(assets.release_headers_debs(OLD_RELEASE))))
    build(BuildRequest(trees=(tree,), nvidia_source=sources, repo=repo))
    return repo


@dataclass(frozen=True)
class Boot:
    """One guest boot's result: the guest's files and the harness's view of it."""

    result: guest.GuestResult

    @property
    def out(self) -> Path:
        return self.result.files

    def text(self, name: str) -> str:
        return (self.out / name).read_text()

    def seconds(self, name: str) -> float:
        """A /proc/uptime reading the guest recorded."""
        return float(self.text(name).split()[0])

    @property
    def install_s(self) -> float:
        return self.seconds("ready") - self.seconds("install-start")

    @property
    def boot_to_ready_s(self) -> float:
        """Kernel start to the install's exit, less the harness's own set-up in the guest
        (simulated GPU, disk and headers unpacked, mirror started)."""
        return self.seconds("ready") - (self.seconds("install-start")
                                        - self.seconds("script-start"))

    def downloads(self) -> list[str]:
        """The requests the mirror served (http.server logs one line per request)."""
        return [line for line in self.text("mirror.log").splitlines() if '"GET ' in line]


def use_kvm(kernel: Kernel) -> bool:
    """KVM where it boots the kernel, TCG otherwise or with GNI_FALLBACK_TCG=1 (the tier's
    rule for compiles in the guest): never a skip for want of KVM."""
    return (os.environ.get("GNI_FALLBACK_TCG") != "1"
            and guest.kvm_unavailable_reason(kernel) is None)


def boot(kernel: Kernel, new: Kernel, repo: Path, out: Path, *, disk: Path | None,
         kvm: bool, by_agent: bool = False) -> Boot:
    """Boot `kernel` with the node's disk (`disk`: a tar of /home/kubernetes, or none: a
    fresh node) and NEW's headers; install; on OLD then prepare NEW (`by_agent`: the node
    agent does, else its command line is run). `out` must not exist."""
    old = kernel.release != new.release
    prepare = (PREPARE_BY_AGENT if by_agent else PREPARE_COMMAND).format(
        install_dir=INSTALL_DIR, wait_s=900 if kvm else 1000)
    script = (PRELUDE + (OLD_BOOT if old else NEW_BOOT)).format(
        fake_gpu=guest.FAKE_GPU_SH, port=PORT, install_dir=INSTALL_DIR, prepare=prepare)
    env = {**NODE_ENV, "PYTHONPATH": str(REPO), "PY": sys.executable, "NEW": new.release,
           "NEW_HEADERS": " ".join(str(d) for d in assets.headers_debs(new)),
           "NEW_MODULES": str(new.modules_dir) if old else "", "MIRROR": str(repo),
           "DISK": str(disk or "")}
    out.mkdir(parents=True)
    tcg_s = 1400.0
    result = guest.run_in_guest(script, kernel=kernel, cwd=REPO, env=env, out_dir=out,
                                kvm=kvm, cpus=2, memory_mb=MEMORY_MB,
                                timeout=600.0 if kvm else tcg_s)
    return Boot(result)
