"""Boot a real Debian kernel under qemu (TCG, or KVM on request) and run a script inside it,
host files visible."""

from __future__ import annotations

import json
import lzma
import os
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import assets
from .assets import Kernel

QEMU = "qemu-system-x86_64"
GNI_DIR = ".gni"  # harness bookkeeping inside the shared out dir
ROOT_SHARE_OPTS = "security_model=none,readonly=on,multidevs=remap"
FAKE_GPU = "0000:00:1e.0"  # where the stand-in nvidia module lists its one GPU
# Guest shell lines that make PCI show one T4 at FAKE_GPU (a sysfs entry bind-mounted over
# /sys/bus/pci/devices): the GPU the stand-in modules and NVML act for.
FAKE_GPU_SH = f"""fake=/tmp/fake-pci/{FAKE_GPU}
mkdir -p "$fake"
echo 0x10de > "$fake/vendor"; echo 0x1eb8 > "$fake/device"
echo 0x030200 > "$fake/class"; echo -1 > "$fake/numa_node"
mount --bind /tmp/fake-pci /sys/bus/pci/devices
"""

# The guest's PID 1 (busybox sh, in an initramfs we build): load the 9p/overlay modules,
# mount the host's / read-only under a tmpfs overlay (guest writes vanish with it), give
# it the extracted kernel's modules tree at /lib/modules/<release>, mount the shared out
# dir read-write at its host path, run the script in a chroot, record its exit code.
INIT_SCRIPT = r"""#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for arg in $(cat /proc/cmdline); do
  case "$arg" in gni.out=*) OUT="${arg#gni.out=}";; gni.mods=*) MODS="${arg#gni.mods=}";; esac
done
for m in /mods/*.ko; do insmod "$m" || echo "gni-init: insmod $m failed"; done
mkdir -p /lower /upper /newroot
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=512000,cache=loose hostroot /lower
mount -t tmpfs -o size=75% upper /upper
mkdir -p /upper/u /upper/w
mount -t overlay -o lowerdir=/lower,upperdir=/upper/u,workdir=/upper/w overlay /newroot
for d in proc sys dev run; do mkdir -p "/newroot/$d"; done
mount -t proc proc /newroot/proc
mount -t sysfs sys /newroot/sys
mount -t devtmpfs dev /newroot/dev
mount -t tmpfs run /newroot/run
mkdir -p "/newroot$OUT"
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 out "/newroot$OUT"
mount -t securityfs securityfs /newroot/sys/kernel/security 2>/dev/null
if [ -n "$MODS" ]; then
  mkdir -p "/newroot/lib/modules/$(uname -r)"
  mount -o bind "/newroot$MODS" "/newroot/lib/modules/$(uname -r)"
fi
if [ -d "/newroot$OUT" ] && [ -f "/newroot$OUT/.gni/run.sh" ]; then
  chroot /newroot /bin/sh "$OUT/.gni/run.sh"
else
  echo "gni-init: the shared out dir $OUT is not visible in the guest"
fi
sync
poweroff -f
"""

# Runs inside the chroot: the caller's env and cwd, then the script, then its exit code.
RUN_SH = """set +e
. "{out}/.gni/env.sh"
cd "{cwd}" || cd /
/bin/bash "{out}/.gni/script.sh" > "{out}/.gni/stdout" 2>&1 < /dev/null
echo $? > "{out}/.gni/rc"
"""


@dataclass(frozen=True)
class GuestResult:
    """What came back: the script's exit code (None: it never finished), output and files."""

    rc: int | None
    stdout: str
    console: str
    files: Path
    wall_s: float

    @property
    def timed_out(self) -> bool:
        return self.rc is None

    def json(self, name: str) -> Any:
        """Load a JSON file the script wrote into $GNI_OUT."""
        return json.loads((self.files / name).read_text())

    def describe(self) -> str:
        """Everything a failing assertion should show."""
        return (
            f"guest rc={self.rc} after {self.wall_s:.1f}s\n--- script output ---\n"
            f"{self.stdout[-6000:]}\n--- console tail ---\n{self.console[-4000:]}"
        )


def qemu_unavailable_reason() -> str | None:
    """Why no guest can boot here at all (the only reason the tier may skip), or None."""
    path = shutil.which(QEMU)
    if path is None:
        return f"{QEMU} not found (apt-get install qemu-system-x86)"
    try:
        proc = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{QEMU} cannot run: {exc}"
    if proc.returncode != 0:
        return f"{QEMU} --version exited {proc.returncode}: {proc.stderr.strip()[:200]}"
    return None


def _newc_entry(name: str, mode: int, data: bytes = b"", rdev: tuple[int, int] = (0, 0)) -> bytes:
    """One cpio 'newc' record, the format the kernel unpacks an initramfs from."""
    fields = [0, mode, 0, 0, 1, 0, len(data), 0, 0, rdev[0], rdev[1], len(name) + 1, 0]
    header = b"070701" + b"".join(b"%08X" % f for f in fields)
    pad = lambda n: b"\0" * (-n % 4)  # noqa: E731
    head = header + name.encode() + b"\0"
    return head + pad(len(head)) + data + pad(len(data))


def _boot_module_files(kernel: Kernel) -> list[Path]:
    """The 9p/virtio/overlay modules and their dependencies, in load order (from modules.dep)."""
    deps: dict[str, list[str]] = {}
    for line in (kernel.modules_dir / "modules.dep").read_text().splitlines():
        target, _, rest = line.partition(":")
        deps[target] = rest.split()
    by_name = {Path(t).name.split(".ko")[0].replace("-", "_"): t for t in deps}
    ordered: list[str] = []

    def visit(rel: str) -> None:
        for dep in reversed(deps[rel]):  # modules.dep lists the deepest dependency last
            visit(dep)
        if rel not in ordered:
            ordered.append(rel)

    for name in assets.GUEST_BOOT_MODULES:
        if name in by_name:  # absent: built into this kernel
            visit(by_name[name])
    return [kernel.modules_dir / rel for rel in ordered]


def _plain_name(mod: Path) -> str:
    return mod.name.removesuffix(".xz").removesuffix(".zst")


def _plain(mod: Path) -> bytes:
    """The module uncompressed (trixie ships .ko.xz; busybox insmod takes plain ELF)."""
    if mod.name.endswith(".xz"):
        return lzma.decompress(mod.read_bytes())
    if mod.name.endswith(".zst"):
        return subprocess.run(["zstd", "-dc", str(mod)], capture_output=True, check=True).stdout
    return mod.read_bytes()


def ensure_initramfs(kernel: Kernel, busybox: Path | None = None) -> Path:
    """Build (once per kernel and init script) the initramfs: busybox, init, boot modules.
    `busybox`: a static busybox of the kernel's arch (default: the host's, x86_64)."""
    busybox = busybox or assets.ensure_busybox()
    modules = _boot_module_files(kernel)
    key = assets.hashlib.sha256(INIT_SCRIPT.encode() + str(busybox).encode())
    for mod in modules:
        key.update(mod.name.encode())
    path = kernel.root / f"initramfs-{key.hexdigest()[:12]}.cpio"
    if path.exists():
        return path
    parts = [_newc_entry(d, 0o40755) for d in ("bin", "dev", "mods", "proc", "sys")]
    parts.append(_newc_entry("dev/console", 0o20600, rdev=(5, 1)))
    parts.append(_newc_entry("bin/busybox", 0o100755, busybox.read_bytes()))
    parts.append(_newc_entry("init", 0o100755, INIT_SCRIPT.encode()))
    for i, mod in enumerate(modules):
        parts.append(_newc_entry(f"mods/{i:02d}-{_plain_name(mod)}", 0o100644, _plain(mod)))
    parts.append(_newc_entry("TRAILER!!!", 0))
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(b"".join(parts))
    tmp.rename(path)
    return path


_KVM_PROBE_S = 30.0
_kvm_reason: list[str | None] = []  # the probe's answer, once per process


def kvm_unavailable_reason(kernel: Kernel | None = None) -> str | None:
    """Why `run_in_guest(kvm=True)` cannot use KVM here (a test then skips saying so), or None.

    /dev/kvm must open and speak the stable API (12), and, given a kernel, actually boot it:
    some hosts offer a /dev/kvm whose hypervisor cannot run a stock kernel, which would show
    as a guest that never prints a line. The boot probe stops at the kernel's first line."""
    if _kvm_reason:
        return _kvm_reason[0]
    reason = _kvm_device_reason() or (_kvm_boot_reason(kernel) if kernel else None)
    _kvm_reason.append(reason)
    return reason


def _kvm_device_reason() -> str | None:
    try:
        fd = os.open("/dev/kvm", os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        return f"/dev/kvm cannot be opened ({exc.strerror}): no hardware virtualization here"
    try:
        import fcntl

        version = fcntl.ioctl(fd, 0xAE00)  # KVM_GET_API_VERSION
    except OSError as exc:
        return f"/dev/kvm does not answer KVM_GET_API_VERSION ({exc.strerror})"
    finally:
        os.close(fd)
    return None if version == 12 else f"/dev/kvm speaks API {version}, not 12"


def _kvm_boot_reason(kernel: Kernel) -> str | None:
    cmd = [QEMU, "-accel", "kvm", "-cpu", "host", "-m", "256", "-nodefaults",
           "-no-user-config", "-display", "none", "-no-reboot", "-serial", "stdio",
           "-monitor", "none", "-kernel", str(kernel.vmlinuz), "-append",
           "console=ttyS0 earlyprintk=serial panic=-1"]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          stdin=subprocess.DEVNULL) as proc:
        assert proc.stdout is not None
        os.set_blocking(proc.stdout.fileno(), False)
        seen, deadline = b"", time.monotonic() + _KVM_PROBE_S
        while time.monotonic() < deadline and proc.poll() is None and b"Linux version" not in seen:
            seen += proc.stdout.read() or b""
            time.sleep(0.2)
        proc.kill()
    if b"Linux version" in seen:
        return None
    tail = seen.decode(errors="replace").strip()[-200:]
    return (f"/dev/kvm is there but {kernel.release} printed no 'Linux version' in "
            f"{_KVM_PROBE_S:.0f} s under -accel kvm (a hypervisor that cannot boot stock "
            f"kernels)" + (f"; last output: {tail}" if tail else ""))


def _qemu_command(
    kernel: Kernel, initrd: Path, out: Path, cmdline: str, memory_mb: int,
    *, kvm: bool = False, cpus: int = 2,
) -> list[str]:
    append = (
        f"console=ttyS0 quiet panic=-1 rdinit=/init gni.out={out} "
        f"gni.mods={kernel.modules_dir} {cmdline}"
    )
    return [
        QEMU,
        *(("-accel", "kvm", "-cpu", "host") if kvm else ("-accel", "tcg")),
        "-smp", str(min(cpus, os.cpu_count() or 1)),
        "-m", str(memory_mb),
        "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
        "-serial", "stdio", "-monitor", "none",
        "-kernel", str(kernel.vmlinuz),
        "-initrd", str(initrd),
        "-append", append.strip(),
        "-virtfs", f"local,path=/,mount_tag=hostroot,{ROOT_SHARE_OPTS}",
        "-virtfs", f"local,path={out},mount_tag=out,security_model=none",
    ]  # fmt: skip


def _write_bookkeeping(out: Path, script: str, env: Mapping[str, str], cwd: Path) -> None:
    gni = out / GNI_DIR
    gni.mkdir()
    (gni / "script.sh").write_text(script)
    lines = [f"export {k}={shlex.quote(v)}" for k, v in env.items()]
    (gni / "env.sh").write_text("\n".join(lines) + "\n")
    (gni / "run.sh").write_text(RUN_SH.format(out=out, cwd=cwd))


def guest_env(kernel: Kernel, out: Path, extra: Mapping[str, str] | None) -> dict[str, str]:
    """The caller's PATH/PYTHONPATH plus where results and the kernel's modules are."""
    env = {k: v for k in ("PATH", "PYTHONPATH", "HOME", "LANG") if (v := os.environ.get(k))}
    env.update(
        GNI_OUT=str(out),
        GNI_KERNEL_RELEASE=kernel.release,
        GNI_KERNEL_MODULES=str(kernel.modules_dir),
        PYTHONDONTWRITEBYTECODE="1",
    )
    env.update(extra or {})
    return env


def run_in_guest(
    script: str,
    *,
    kernel: Kernel,
    cmdline: str = "",
    timeout: float = 300.0,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    memory_mb: int = 2048,
    out_dir: Path | None = None,
    kvm: bool = False,
    cpus: int = 2,
) -> GuestResult:
    """Boot `kernel`, run `script` with bash as root inside it, and return what it reported.

    qemu's own exit status says nothing about the script, so the guest writes the
    script's exit code and output into the shared out dir ($GNI_OUT), which is also
    where the script leaves result files for the test to read. `kvm=True` runs the guest
    under KVM (`-accel kvm -cpu host`) for work TCG is too slow for (a compile); callers
    check `kvm_unavailable_reason()` first and skip with its reason, never silently.
    """
    if kvm and (reason := kvm_unavailable_reason(kernel)):
        raise RuntimeError(f"kvm=True but {reason}")
    out = Path(out_dir or tempfile.mkdtemp(prefix="gni-guest-")).resolve()
    work = Path(cwd or Path.cwd()).resolve()
    _write_bookkeeping(out, script, guest_env(kernel, out, env), work)
    cmd = _qemu_command(kernel, ensure_initramfs(kernel), out, cmdline, memory_mb, kvm=kvm,
                        cpus=cpus)
    return boot_and_collect(cmd, out, timeout)


def boot_and_collect(cmd: list[str], out: Path, timeout: float) -> GuestResult:
    """Run qemu (`cmd`) until the guest powers off or `timeout`, then read what the guest's
    run.sh left in the shared out dir: the script's exit code, its output, the console."""
    start = time.monotonic()
    console_path = out / GNI_DIR / "console.log"
    with open(console_path, "wb") as console:
        proc = subprocess.Popen(
            cmd, stdout=console, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    wall = time.monotonic() - start
    rc_file = out / GNI_DIR / "rc"
    rc = int(rc_file.read_text()) if rc_file.is_file() and rc_file.read_text().strip() else None
    stdout_file = out / GNI_DIR / "stdout"
    stdout = stdout_file.read_text(errors="replace") if stdout_file.is_file() else ""
    return GuestResult(rc, stdout, console_path.read_text(errors="replace"), out, wall)
