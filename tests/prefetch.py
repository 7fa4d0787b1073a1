"""Fetch and build what the slow tiers need, in the background, while the quick tiers run.

    .venv/bin/python tests/prefetch.py --start   # detached; `make test` runs it first
    .venv/bin/python tests/prefetch.py --stop    # after pytest: ends one still running
    .venv/bin/python tests/prefetch.py           # in the foreground (what --start runs)

On a new machine the real-kernel tier's assets (Debian's kernels, headers and NVIDIA
packages, the compiled real modules, trixie's and the arm64 roots, the cross-built 535) take
most of a cold run. `make test` starts this first: it builds them in the order the tiers
need them while the unit, CLI, host and adversarial tiers run in the foreground. Every step is
the same function a test fixture calls, under the same cache lock, so a test that needs an
asset still being built waits for that one asset only, and one already built costs nothing.
A failed step is logged and skipped: the fixture that needs it builds it again and fails
there, with its own message. The log (`<cache>/prefetch.log`) says each step's seconds.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from kernel import apt as _apt  # noqa: E402  (after the path: tests/ is the import root)


def _steps() -> list[tuple[str, Callable[[], object]]]:
    """What to make, in the order the tiers ask for it (the kernel tier runs its x86_64
    guests first and the arm64 ones last: tests/kernel/conftest.py)."""
    import artifacts
    from deploy import podman
    from kernel import arm64, arm64cross, assets, matrixrepos, nextkernel, trixie

    @functools.cache
    def x86() -> assets.Kernel:  # once: the steps after it reuse the kernel it made
        return assets.ensure_all(real_nvidia=False)

    return [
        ("NVIDIA 535 .debs", lambda: (artifacts.nvidia_debs(with_source=True),
                                      artifacts.nvidia_debs("535.309.01"))),
        ("image base rootfs (amd64)", podman.base_tarball),
        ("image base rootfs (arm64, emulated)", lambda: _foreign_base(podman)),
        ("bookworm kernel, headers, busybox, test modules", x86),
        ("bookworm's previous kernel (the next-kernel reboot)", nextkernel.old_kernel),
        ("NVIDIA 535 compiled for it", lambda: assets.build_nvidia_cli(x86())),
        ("535 for two kernels (matrix)", lambda: matrixrepos.two_kernels_repo(x86())),
        ("535 in both flavours (matrix)", lambda: matrixrepos.both_flavours_repo(x86())),
        ("trixie kernel and open 550 (build root)",
         lambda: trixie.build_open_package(trixie.kernel())),
        ("open 550 without its patch (the compile's failure)",
         lambda: trixie.unpatched_build(trixie.kernel())),
        ("arm64 kernel, root and wheel", arm64.ensure_all),
        ("arm64 open 535 cross-built", lambda: arm64cross.cross_package("open")),
    ]


def _foreign_base(podman: Any) -> object:
    """The arm64 image base where the deploy tier builds one (qemu-user's binfmt handler on)."""
    return podman.why_arch_cannot_run("arm64") or podman.base_tarball("arm64")


def run_steps() -> int:
    """Each step once, timed; a failure is logged and the next step runs. GNI_PREFETCH_ONLY
    (step names, comma-separated) runs only those."""
    only = os.environ.get("GNI_PREFETCH_ONLY")
    failed = 0
    for name, step in _steps():
        if only is not None and name not in only.split(","):
            continue
        started = time.monotonic()
        try:
            step()
        except Exception as exc:  # the fixture that needs it will say why
            failed += 1
            _apt.log(f"prefetch: {name}: FAILED after {time.monotonic() - started:.0f} s: "
                     f"{type(exc).__name__}: {str(exc)[:500]}")
            continue
        _apt.log(f"prefetch: {name}: ready in {time.monotonic() - started:.0f} s")
    return 1 if failed else 0


def _files() -> tuple[Path, Path]:
    root = _apt.cache_root()
    root.mkdir(parents=True, exist_ok=True)
    return root / "prefetch.pid", root / "prefetch.log"


def start() -> int:
    """Run the steps in a new session, detached, its output in the log; one line says where."""
    pid_file, log_file = _files()
    with log_file.open("a") as log:
        log.write(f"--- prefetch started {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        log.flush()
        child = subprocess.Popen([sys.executable, str(Path(__file__).resolve())], stdout=log,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 start_new_session=True, cwd=HERE.parent)
    pid_file.write_text(f"{child.pid}\n")
    print(f"prefetch: building the slow tiers' assets in the background (pid {child.pid}); "
          f"log: {log_file}", flush=True)
    return 0


def stop() -> int:
    """End the prefetch this machine's `--start` began, if it still runs (its session)."""
    pid_file, _ = _files()
    with contextlib.suppress(FileNotFoundError, ProcessLookupError, PermissionError,
                             ValueError):
        pid = int(pid_file.read_text())
        pid_file.unlink()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if str(Path(__file__).resolve()).encode() in cmdline and os.getsid(pid) == pid:
            os.killpg(pid, signal.SIGTERM)
            print(f"prefetch: stopped (pid {pid}), pytest had finished first", flush=True)
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--start", action="store_true", help="run detached, log to the cache")
    group.add_argument("--stop", action="store_true", help="end a detached run still going")
    args = parser.parse_args(argv)
    if args.start:
        return start()
    if args.stop:
        return stop()
    return run_steps()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
