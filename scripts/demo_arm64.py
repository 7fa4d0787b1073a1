"""`make demo ARCH=arm64`: the whole install on Debian's arm64 kernel, no GPU, no arm64 box.

What is real, beyond `make demo`'s list: bookworm's linux-image-arm64 booted under
qemu-system-aarch64 -M virt -cpu max (TCG), an arm64 root from Debian's arm64 packages with
the product installed from its wheel, the package cross-compiled by `package build` for the
guest's release from Debian's arm64 headers, Debian's arm64 NVIDIA user-mode files, and
NVIDIA's real 535 nvidia.ko cross-built for the guest's release, which the kernel loads and
refuses with ENODEV (no GPU). Simulated as in `make demo`: the GPU, the module sources (the
stand-ins, cross-compiled), NVML/CUDA (the C stand-ins, cross-compiled).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

# demo_shared first: it puts the repository and tests/ on the module search path
from demo_shared import BANNER, GUEST_SCRIPT, make_mirror, say, user_tree, work_dir  # isort: skip
from arm64debs import LIB_DIR, arm64_tree
from kernel import arm64, arm64cross, guest

REAL_LOAD = r"""
echo "== the guest: $(uname -m), kernel $(uname -r), python $(python3 -c \
  'import platform, sys; print(platform.machine(), "%d.%d" % sys.version_info[:2])'), \
modules.dep $(test -f "/lib/modules/$(uname -r)/modules.dep" && echo present || echo missing)"
touch /usr/gni-demo-write-stays-in-guest  # the guest's root is a throw-away overlay
python3 -m installer detect --host-root / --proc-root /proc --sys-root /sys \
  --log-format console | sed 's/^/   /'
echo "== NVIDIA's real 535 nvidia.ko (cross-built for $(uname -r)): finit_module, no GPU"
modprobe drm  # arm64's nvidia.ko needs the kernel's drm (modinfo: depends=drm)
python3 - "$GNI_OUT/nvidia-real.ko" <<'PY'
import errno, os, sys
from installer.node import syscalls
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_CLOEXEC)
try:
    syscalls.finit_module(fd, "")
except OSError as exc:
    print(f"   finit_module: {errno.errorcode.get(exc.errno, exc.errno)} ({exc.strerror})")
else:
    sys.exit("   finit_module: loaded, which it cannot without a GPU")
PY
dmesg | grep -m 3 NVRM | sed 's/^/   /' || true
"""


def main_arm64() -> int:
    """Build (cached) and boot the arm64 guest; install, second run, agent, status."""
    reason = arm64.qemu_unavailable_reason()
    if reason:
        say(f"cannot boot an arm64 guest: {reason}; run `make deps` as root first")
        return 2
    start = time.monotonic()
    say("preparing Debian's arm64 kernel, root, headers and NVIDIA 535 files (cached after once)")
    kernel = arm64.ensure_all()
    work = work_dir("demo-arm64")
    tree = user_tree(work, arm64_tree(), LIB_DIR, arm64.CROSS_CC)
    mirror = make_mirror(work, arm64cross.arm64_headers_debs(kernel.release), tree,
                         "--arch", "aarch64")
    real = arm64.real_nvidia_ko()
    out = Path(tempfile.mkdtemp(prefix="gni-demo-arm64-"))
    try:
        shutil.copytree(mirror, out / "mirror")
        shutil.copy2(real, out / "nvidia-real.ko")
        say(f"booting {kernel.release} under qemu-system-aarch64 (TCG) ... {BANNER}")
        script = REAL_LOAD + GUEST_SCRIPT.format(fake_gpu=guest.FAKE_GPU_SH, repo="/",
                                                 python="python3", mirror=out / "mirror",
                                                 banner=BANNER)
        result = arm64.run_in_guest(script, kernel=kernel, timeout=1200, out_dir=out)
        print(result.stdout, end="", flush=True)
        if result.rc != 0:
            say(f"FAILED (guest exit {result.rc})\n{result.console[-3000:]}")
            return 1
    finally:
        shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(mirror.parent, ignore_errors=True)
    say(f"done in {time.monotonic() - start:.0f}s ({result.wall_s:.0f}s in the guest)")
    return 0
