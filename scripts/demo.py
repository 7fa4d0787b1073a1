#!/usr/bin/env python3
"""`make demo`: the whole install on a real Linux kernel, no GPU needed.

What is real: Debian bookworm's own kernel (booted under qemu/TCG), kernel module loading
through finit_module, the device nodes, the driver package built by `package build` from
NVIDIA's 535.261.03 user-mode files (Debian non-free), a mirror on the guest's 127.0.0.1,
download + sha256, atomic staging, readiness files, `status`.
The package is made the way an operator makes one: `gpu-node-installer package build
--nvidia-source SRC --kernel-headers <Debian's 3 headers .debs> --tree ... --repo ...`,
the product compiling the modules against the kernel's headers.
What is simulated, and said so: the GPU (a T4's PCI sysfs entry bind-mounted in the guest),
the kernel-module *sources* (test stand-ins named nvidia/nvidia-uvm/..., laid out like
NVIDIA's module tree, so that the modules load without a GPU), and NVML/CUDA (C stand-ins
replace libnvidia-ml and libcuda in the package).
Everything is cached outside the repo; a second run takes about a minute.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from artifacts import LIB_DIR, cache_root, nvidia_tree  # noqa: E402
from kernel import assets, guest  # noqa: E402
from native import CUDA_SONAME, NVML_SONAME, build_standins  # noqa: E402

VERSION = "535.261.03"
FAKE_GPU = guest.FAKE_GPU
# NVIDIA's module trees are entered with `make modules SYSSRC=... SYSOUT=... CC=...`; the
# stand-ins hand over to the kernel's Kbuild the same way.
STANDIN_MAKEFILE = """\
# Test stand-in for NVIDIA's module-tree Makefile (see scripts/demo.py)
modules:
\t$(MAKE) -C $(SYSOUT) M=$(CURDIR) CC=$(CC) modules
"""
BANNER = ("no GPU here: NVML simulated (stand-in libnvidia-ml/libcuda), PCI GPU simulated "
          f"(T4 sysfs entry at {FAKE_GPU}); kernel, module loading, device nodes, download "
          "and staging are real")

GUEST_SCRIPT = r"""
set -e
{fake_gpu}
ip link set lo up
cd {repo}
{python} -m http.server 8080 --bind 127.0.0.1 --directory {mirror} >/tmp/mirror.log 2>&1 &
probe='import socket; socket.create_connection(("127.0.0.1", 8080))'
for i in $(seq 50); do {python} -c "$probe" 2>/dev/null && break; sleep 0.1; done
echo "== {banner}"
echo "== gpu-node-installer install (mirror http://127.0.0.1:8080 inside the guest)"
args="--host-root / --proc-root /proc --sys-root /sys --dev-root /dev --log-format console"
{python} -m installer install $args --mirror http://127.0.0.1:8080 --allow-http \
    --driver-version 535 --termination-log /tmp/termination-log
echo "== ls -l /dev/nvidia*"
ls -l /dev/nvidia* | sed 's/^/   /'
echo "== second run (the reboot fast path: nothing downloaded or copied)"
{python} -m installer install $args --mirror http://127.0.0.1:9 --allow-http \
    --driver-version 535
echo "== gpu-node-installer agent --once (the node agent's first round: daemons, readiness)"
{python} -m installer agent --once $args
echo "== gpu-node-installer status"
{python} -m installer status $args
"""


def say(message: str) -> None:
    print(f"demo: {message}", flush=True)


def user_tree(work: Path, base: Path | None = None, lib_dir: str = LIB_DIR,
              cc: str = "gcc") -> Path:
    """NVIDIA's real user-mode files, with NVML and CUDA swapped for the stand-ins (compiled
    by `cc`: the arm64 demo's are cross-compiled)."""
    tree = work / "tree"
    if tree.exists():
        shutil.rmtree(tree)
    subprocess.run(["cp", "-al", str(base or nvidia_tree(VERSION)), str(tree)], check=True)
    built = build_standins(work / "standins", cc=cc)
    for soname, real in ((NVML_SONAME, "libnvidia-ml.so"), (CUDA_SONAME, "libcuda.so")):
        target = tree / lib_dir / f"{real}.{VERSION}"
        target.unlink()
        shutil.copy(built / soname, target)
    return tree


def standin_source(work: Path) -> Path:
    """The stand-in modules' sources as an NVIDIA module tree (Kbuild naming the version)."""
    tree = work / "standin-source"
    if tree.exists():
        shutil.rmtree(tree)
    tree.mkdir(parents=True)
    for source in assets.MODULES_SRC.glob("*.c"):
        shutil.copy(source, tree / source.name)
    kbuild = (assets.MODULES_SRC / "Kbuild").read_text()
    (tree / "Kbuild").write_text(kbuild.replace("$(NV_VERSION)", VERSION)
                                 .replace("ifeq ($(NV_FLAVOUR),open)", "ifeq (open,open)"))
    (tree / "Makefile").write_text(STANDIN_MAKEFILE)
    return tree


def make_mirror(work: Path, headers: list[Path], tree: Path, *extra: str) -> Path:
    """`gpu-node-installer package build --nvidia-source ...` into a repository directory."""
    mirror = work / "mirror"
    shutil.rmtree(mirror, ignore_errors=True)  # a fresh repository: nothing of an older run's
    cmd = [sys.executable, "-m", "installer", "package", "build",
           "--nvidia-source", str(standin_source(work)),
           *(f"--kernel-headers={deb}" for deb in headers),
           "--tree", str(tree), "--repo", str(mirror),
           "--alias", "default", "--alias", "latest", "--force", *extra]
    say("$ gpu-node-installer package build --nvidia-source standin-source "
        + " ".join(f"--kernel-headers {deb.name}" for deb in headers)
        + " --tree tree --repo mirror --alias default --alias latest " + " ".join(extra))
    started = time.monotonic()
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"demo: package build failed (exit {done.returncode}):\n"
                         f"{done.stderr[-3000:]}")
    say(f"{done.stdout.splitlines()[0]} ({time.monotonic() - started:.0f}s)")
    return mirror


def main() -> int:
    arch = "=".join(sys.argv[1:]).removeprefix("--arch=") if sys.argv[1:] else "amd64"
    if arch in ("arm64", "aarch64"):
        from demo_arm64 import main_arm64

        return main_arm64()
    if arch not in ("amd64", "x86_64"):
        say(f"unknown arguments {' '.join(sys.argv[1:])}: use --arch amd64 or --arch arm64")
        return 2
    reason = guest.qemu_unavailable_reason()
    if reason:
        say(f"cannot boot a guest: {reason}; run `make deps` as root first")
        return 2
    start = time.monotonic()
    say("preparing Debian's kernel and headers and NVIDIA 535 files (cached after once)")
    kernel = assets.ensure_headers(assets.ensure_kernel(assets.kernel_release()))
    assets.ensure_busybox()
    work = cache_root() / "demo"
    work.mkdir(parents=True, exist_ok=True)
    mirror = make_mirror(work, assets.headers_debs(kernel), user_tree(work))
    say(f"booting {kernel.release} under qemu (TCG) ... {BANNER}")
    script = GUEST_SCRIPT.format(fake_gpu=guest.FAKE_GPU_SH, repo=REPO,
                                 python=sys.executable,
                                 mirror=mirror, banner=BANNER)
    result = guest.run_in_guest(script, kernel=kernel, timeout=600, cwd=REPO)
    print(result.stdout, end="", flush=True)
    if result.rc != 0:
        say(f"FAILED (guest exit {result.rc})\n{result.console[-3000:]}")
        return 1
    say(f"done in {time.monotonic() - start:.0f}s ({result.wall_s:.0f}s in the guest)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
