"""What `make demo` and `make demo ARCH=arm64` share: the module search path, the guest's
script, the user-mode tree with the NVML/CUDA stand-ins, and the package build into a
mirror. Both demo scripts import this module; it imports neither.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
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


def work_dir(name: str) -> Path:
    """A demo's work directory in the test cache (kept between runs)."""
    work = cache_root() / name
    work.mkdir(parents=True, exist_ok=True)
    return work


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
    """`gpu-node-installer package build --nvidia-source ...` into a fresh repository of this
    run's own (a temp dir: two demos at once never share one); the caller removes its parent."""
    mirror = Path(tempfile.mkdtemp(prefix="gni-demo-mirror-")) / "mirror"
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
