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
import sys
import time

from demo_arm64 import main_arm64
from demo_shared import BANNER, GUEST_SCRIPT, REPO, make_mirror, say, user_tree, work_dir
from kernel import assets, guest


def main() -> int:
    arch = "=".join(sys.argv[1:]).removeprefix("--arch=") if sys.argv[1:] else "amd64"
    if arch in ("arm64", "aarch64"):
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
    work = work_dir("demo")
    mirror = make_mirror(work, assets.headers_debs(kernel), user_tree(work))
    say(f"booting {kernel.release} under qemu (TCG) ... {BANNER}")
    script = GUEST_SCRIPT.format(fake_gpu=guest.FAKE_GPU_SH, repo=REPO,
                                 python=sys.executable,
                                 mirror=mirror, banner=BANNER)
    try:
        result = guest.run_in_guest(script, kernel=kernel, timeout=600, cwd=REPO)
    finally:
        shutil.rmtree(mirror.parent, ignore_errors=True)
    print(result.stdout, end="", flush=True)
    if result.rc != 0:
        say(f"FAILED (guest exit {result.rc})\n{result.console[-3000:]}")
        return 1
    say(f"done in {time.monotonic() - start:.0f}s ({result.wall_s:.0f}s in the guest)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
