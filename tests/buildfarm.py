"""The build farm's moves for tests and benchmarks: a 3-kernel x 2-flavour matrix of
stand-in sources, `package build --shard` processes, `package index`, tree comparison."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from nvsources import mini_source, proprietary_source

CLI = (sys.executable, "-m", "installer")


def run_tree(dest: Path, version: str = "535.261.03") -> Path:
    """A `.run`-shaped stand-in: kernel/ (proprietary) and kernel-open/ (open). The
    proprietary nvidia.ko really declares NVIDIA's licence, so real headers build it as
    the proprietary flavour too."""
    root = dest / f"NVIDIA-Linux-x86_64-{version}"
    proprietary = proprietary_source(root / "kernel", version)
    core = proprietary / "nvidia.c"
    core.write_text(core.read_text().replace('MODULE_LICENSE("GPL")', 'MODULE_LICENSE("NVIDIA")'))
    mini_source(root / "kernel-open", version)
    return root


def matrix_args(source: Path, headers: list[Path], jobs: int) -> list[str]:
    """`package build` arguments of both flavours for every kernel of `headers`."""
    unique = {h.name: h for h in headers}  # linux-kbuild is shared by the releases
    return [f"--nvidia-source={source}", "--flavour=both", f"--jobs={jobs}",
            *(f"--kernel-headers={h}" for h in unique.values())]


def start_shard(args: list[str], repo: Path, spec: str) -> subprocess.Popen[str]:
    return subprocess.Popen([*CLI, "package", "build", *args, f"--repo={repo}",
                             f"--shard={spec}", "--output=json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(process: subprocess.Popen[str], timeout: float = 1800) -> str:
    """The process's stdout, once it exited 0 (else an AssertionError with its stderr)."""
    out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, err[-3000:]
    return out


def timed(argv: list[str]) -> float:
    """Run a CLI command to success; its wall time in seconds."""
    started = time.monotonic()
    done = subprocess.run([*CLI, *argv], capture_output=True, text=True, check=False)
    seconds = time.monotonic() - started
    assert done.returncode == 0, done.stderr[-3000:]
    return seconds


def package_files(root: Path) -> dict[str, bytes]:
    """Every package file by path: not index.json, not the hidden locks and receipts."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != "index.json"
            and not any(part.startswith(".") for part in p.relative_to(root).parts)}
