#!/usr/bin/env python3
"""Benchmark: boot-to-ready on the next kernel, with and without its preparation.

    .venv/bin/python benchmarks/next_kernel.py [--quick]

Two of Debian's real kernels under qemu, the scene of tests/kernel/test_next_kernel.py
(tests/kernel/nextkernel.py): boot 1 runs 6.1.0-56-amd64, installs from the mirror, keeps
the node's disk, then prepares 6.1.0-57-amd64 (`nice -n 19 ionice -c 3 ... prepare
--kernel`, BUILD_FALLBACK=auto: compiled from 57's real headers into the host cache) and
keeps the disk again. Then, in the same run, two boots of 6.1.0-57-amd64:
  with     from the prepared disk: the package from the host cache, no compile, no download
  without  from the disk as it was before the preparation: the install compiles at boot
Each reports boot-to-ready (kernel start to the install's exit, less the harness's own
set-up in the guest: simulated GPU, disk and headers unpacked, mirror started) and the
install's own seconds; the difference is what the preparation takes off the reboot. KVM where
it boots the kernel, TCG otherwise (printed). `--quick` (the test suite runs it): the kernels,
headers and mirror of the scene, no boot (test_next_kernel.py boots boot 1 and `with` every
suite run of the kernel tier).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from tests.kernel import assets, guest, nextkernel  # noqa: E402


def _compiled(boot: nextkernel.Boot, name: str) -> bool:
    """Whether the command whose JSON log is `name` built a package on the node."""
    return '"package built on node"' in boot.text(name)


def _check(boot: nextkernel.Boot, what: str) -> None:
    if boot.result.rc != 0 or boot.text("install.rc").strip() != "0":
        log = boot.out / "install.log"
        sys.exit(f"{what}: the guest failed\n{boot.result.describe()}\n"
                 f"{log.read_text()[-3000:] if log.exists() else ''}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="the scene's assets and mirror, no boot (the test suite runs this)")
    opts = parser.parse_args()
    reason = guest.qemu_unavailable_reason()
    if reason and not opts.quick:
        sys.exit(f"needs qemu: {reason}")
    new = assets.ensure_headers(assets.ensure_kernel(assets.kernel_release()))
    old = nextkernel.old_kernel()
    assets.headers_debs(new)
    with tempfile.TemporaryDirectory(prefix="gni-bench-next-kernel-") as tmp:
        work = Path(tmp)
        started = time.monotonic()
        repo = nextkernel.make_repo(work / "mirror")
        print(f"mirror for {old.release} (+ a source package): "
              f"{time.monotonic() - started:.1f} s", flush=True)
        if opts.quick:
            print("boots: not run with --quick (tests/kernel/test_next_kernel.py boots the "
                  "scene)")
            return
        kvm = nextkernel.use_kvm(new)
        load = os.getloadavg()
        print(f"accel {'kvm' if kvm else 'tcg'}, {os.cpu_count()} host cores, "
              f"load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}", flush=True)
        first = nextkernel.boot(old, new, repo, work / "boot1", disk=None, kvm=kvm)
        _check(first, f"boot 1 ({old.release})")
        if first.text("prepare.rc").strip() != "0":
            sys.exit(f"prepare failed:\n{first.text('prepare.log')[-3000:]}")
        prepared = json.loads(first.text("prepare.json"))
        print(f"boot 1 {old.release}: ready {first.boot_to_ready_s:.1f} s after boot; "
              f"prepare {new.release}: {prepared['duration_s']:.1f} s ({prepared['source']})",
              flush=True)
        runs = {}
        for name, disk in (("with", "disk.tar"), ("without", "disk-unprepared.tar")):
            boot = nextkernel.boot(new, new, repo, work / f"boot-{name}",
                                   disk=first.out / disk, kvm=kvm)
            _check(boot, f"boot {name} the preparation")
            runs[name] = boot
            print(f"{name} the preparation: boot-to-ready {boot.boot_to_ready_s:.1f} s "
                  f"(install {boot.install_s:.1f} s; compiled at boot: "
                  f"{_compiled(boot, 'install.log')}; downloads {len(boot.downloads())})",
                  flush=True)
        end_load = os.getloadavg()
        with_, without = runs["with"], runs["without"]
        print(json.dumps({
            "accel": "kvm" if kvm else "tcg", "host_cores": os.cpu_count(),
            "load_before": round(load[0], 2), "load_after": round(end_load[0], 2),
            "old": old.release, "new": new.release,
            "prepare_s": prepared["duration_s"],
            "with_boot_to_ready_s": round(with_.boot_to_ready_s, 1),
            "with_install_s": round(with_.install_s, 1),
            "without_boot_to_ready_s": round(without.boot_to_ready_s, 1),
            "without_install_s": round(without.install_s, 1),
            "saved_s": round(without.boot_to_ready_s - with_.boot_to_ready_s, 1),
            "with_compiled": _compiled(with_, "install.log"),
            "without_compiled": _compiled(without, "install.log"),
            "with_downloads": len(with_.downloads()),
            "without_downloads": len(without.downloads()),
        }, indent=1))


if __name__ == "__main__":
    main()
