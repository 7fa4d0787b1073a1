"""Runs inside the guest: the load stage's scenarios on the real kernel, results as JSON.

One guest boot runs a whole group (a boot costs ~12 s under TCG), so each scenario records
what it observed (the stage's result or error, /proc/modules, device nodes, sysfs) and the
pytest side asserts on it. Usage: python tests/kernel/scenarios.py GROUP ARGS.json OUT.json
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from installer.config import ModuleParam
from installer.errors import InstallerError
from installer.node import kmod, syscalls
from installer.node.host import RealHost, Roots
from installer.packages.manifest import Package
from installer.packages.tree import read_tree
from installer.stages import load
from installer.testing.kernel import ModuleFile, write_package

HOST = RealHost(Roots(Path("/"), Path("/proc"), Path("/sys"), Path("/dev")))
RELEASE = os.uname().release
WORK = Path("/tmp/gni-scenarios")
NVIDIA_NAMES = ("nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm", "nvidia_peermem")


def package(name: str, ko_dir: Path, version: str, files: list[tuple[str, str]],
            params: dict[str, str] | None = None) -> Package:
    """A package of `ko_dir`'s modules, manifest order as given, like `package build`."""
    modules = [ModuleFile(mod, ko_dir / file, params=dict(params or {}) if mod == "nvidia"
                          else {}) for mod, file in files]
    return write_package(WORK / name, modules, driver_version=version, kernel_release=RELEASE)


CORE = [("nvidia", "nvidia.ko"), ("nvidia_uvm", "nvidia-uvm.ko")]
FULL = [*CORE, ("nvidia_modeset", "nvidia-modeset.ko"), ("nvidia_drm", "nvidia-drm.ko")]


def modules_now() -> list[str]:
    return sorted(m.name for m in kmod.loaded_modules(HOST) or [])


def nodes_now() -> dict[str, list[int]]:
    """Every /dev/nvidia* char node: [major, minor, mode], plus /dev/char link targets."""
    found: dict[str, list[int]] = {}
    for path in sorted(Path("/dev").glob("nvidia*")) + sorted(Path("/dev").glob("nvidia-caps/*")):
        info = path.lstat()
        if stat.S_ISCHR(info.st_mode):
            rel = str(path.relative_to("/dev"))
            found[rel] = [os.major(info.st_rdev), os.minor(info.st_rdev),
                          stat.S_IMODE(info.st_mode)]
    return found


def char_links() -> dict[str, str]:
    links = {}
    for link in Path("/dev/char").glob("*"):
        target = os.readlink(link)
        if "nvidia" in target:
            links[link.name] = target
    return links


def observe() -> dict[str, Any]:
    versions = {n: (HOST.read_text(Path(f"/sys/module/{n}/version")) or "").strip() or None
                for n in NVIDIA_NAMES}
    return {"modules": modules_now(), "nodes": nodes_now(), "char_links": char_links(),
            "versions": {k: v for k, v in versions.items() if v},
            "devices": kmod.char_majors(HOST),
            "nvrm": HOST.read_text(Path("/proc/driver/nvidia/version"))}


def attempt(fn: Callable[[], Any]) -> dict[str, Any]:
    """Run one installer call; record its result or its error, then the kernel's state."""
    start = time.monotonic()
    try:
        value = fn()
        outcome: dict[str, Any] = {"result": value.to_dict() if hasattr(value, "to_dict")
                                   else {"unloaded": value.unloaded}}
    except InstallerError as exc:
        outcome = {"error": {"type": type(exc).__name__, "slug": exc.slug, "code": exc.code,
                             "message": exc.message, "remedy": exc.remedy}}
    outcome["seconds"] = round(time.monotonic() - start, 2)
    outcome["after"] = observe()
    return outcome


def hold_open(device: str) -> subprocess.Popen[str]:
    """A process that keeps `device` open until killed (a GPU workload stand-in)."""
    code = ("import os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR); "
            "print('open', flush=True); time.sleep(600)")
    proc = subprocess.Popen([sys.executable, "-c", code, device], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "open"
    return proc


def group_main(args: dict[str, Any]) -> dict[str, Any]:
    """No signature enforcement: real NVIDIA first (clean kernel), then the test modules."""
    out: dict[str, Any] = {"release": RELEASE}
    real = Path(args["real_nvidia"])
    test535, test550 = Path(args["test_535"]), Path(args["test_550"])
    out["before_real"] = observe()
    real_pkg = package(f"preloaded/{RELEASE}/535.261.03/proprietary", real, "535.261.03", FULL)
    out["real_nvidia"] = attempt(lambda: load.load_package(HOST, real_pkg))
    out["dmesg_nvrm"] = [line for line in _dmesg() if "NVRM" in line][-5:]
    out["real_nvidia_cli"] = cli_load(WORK / "preloaded", "535.261.03")

    params = [ModuleParam("nvidia", "NVreg_EnableMSI", "0")]
    core535 = package("core535", test535, "535.261.03", CORE,
                      params={"NVreg_DeviceFileMode": "438"})
    out["fresh"] = attempt(lambda: load.load_package(HOST, core535, params=params))
    out["fresh_params"] = {
        p: (HOST.read_text(Path(f"/sys/module/nvidia/parameters/{p}")) or "").strip()
        for p in ("NVreg_EnableMSI", "NVreg_DeviceFileMode", "NVreg_EnableGpuFirmware")}
    out["fresh_inodes"] = _inodes()
    out["second"] = attempt(lambda: load.load_package(HOST, core535, params=params))
    out["second_inodes"] = _inodes()

    core550 = package("core550", test550, "550.54.14", CORE)
    out["change"] = attempt(lambda: load.load_package(HOST, core550))
    holder = hold_open("/dev/nvidiactl")
    out["holder_pid"] = holder.pid
    out["in_use"] = attempt(lambda: load.load_package(HOST, core535))
    holder.kill()
    holder.wait()
    out["unload"] = attempt(lambda: load.unload(HOST))

    full535 = package("full535", test535, "535.261.03", FULL)
    out["drm"] = attempt(lambda: load.load_package(HOST, full535))
    out["drm_dep_line"] = _modules_dep_line("drm_kms_helper")
    return out


def cli_load(preloaded: Path, version: str) -> dict[str, Any]:
    """`gpu-node-installer load` as an operator runs it: fetch from a preloaded dir, load."""
    termination_log = WORK / "termination-log"
    argv = [sys.executable, "-m", "installer", "load", "--host-root", "/", "--proc-root",
            "/proc", "--sys-root", "/sys", "--dev-root", "/dev", "--preloaded-dir",
            str(preloaded), "--driver-version", version, "--flavour", "proprietary",
            "--install-dir", str(WORK / "install"), "--termination-log", str(termination_log),
            "--log-format", "json"]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    return {"rc": done.returncode, "stderr_tail": done.stderr.splitlines()[-3:],
            "termination_log": termination_log.read_text() if termination_log.exists()
            else None, "after": observe()}


def group_sig_enforce(args: dict[str, Any]) -> dict[str, Any]:
    """Booted with module.sig_enforce=1: preflight refuses; forcing meets the kernel's 129."""
    test535 = Path(args["test_535"])
    core535 = package("core535", test535, "535.261.03", CORE)
    out: dict[str, Any] = {"sig_enforce": (HOST.read_text(
        Path("/sys/module/module/parameters/sig_enforce")) or "").strip()}
    out["before"] = observe()
    out["preflight"] = attempt(lambda: load.load_package(HOST, core535))
    out["forced"] = attempt(lambda: load.load_package(HOST, core535, force=True))
    if args.get("product_signed"):
        out.update(_signed_cases(args, test535))
    return out


def _signed_cases(args: dict[str, Any], test535: Path) -> dict[str, Any]:
    """Modules `package build` signed: raw finit_module errno and the kernel's own words."""
    product, vendor = Path(args["product_signed"]), Path(args["vendor_attached"])
    out: dict[str, Any] = {"product_load": attempt(lambda: load.load_package(
        HOST, read_tree(product)))}
    for case, path in (("raw_product", product / "modules" / "nvidia.ko"),
                       ("raw_unsigned", test535 / "nvidia.ko"),
                       ("raw_vendor", vendor / "modules" / args["vendor_file"])):
        out[case] = raw_finit(path)
    return out


def raw_finit(path: Path) -> dict[str, Any]:
    """finit_module on one file, past the product's preflight: errno, its text, and the
    kernel's own words in dmesg."""
    before = len(_dmesg())
    fd = os.open(path, os.O_RDONLY)
    try:
        syscalls.finit_module(fd, "")
        code = 0
    except OSError as exc:
        code = exc.errno or -1
    finally:
        os.close(fd)
    return {"errno": code, "strerror": os.strerror(code) if code else "",
            "dmesg": _dmesg()[before:], "modules": modules_now()}


def group_raw_loads(args: dict[str, Any]) -> dict[str, Any]:
    """Each file through raw finit_module, with what the boot enforces (the COS
    modules: parsed as signed, refused for their key)."""
    return {"sig_enforce": Path("/sys/module/module/parameters/sig_enforce").read_text()
            .strip(), "cmdline": Path("/proc/cmdline").read_text().strip(),
            "cases": {case: raw_finit(Path(path)) for case, path in args["cases"]}}


def _inodes() -> dict[str, int]:
    return {p.name: p.lstat().st_ino for p in Path("/dev").glob("nvidia*") if not p.is_dir()}


def _dmesg() -> list[str]:
    done = subprocess.run(["dmesg"], capture_output=True, text=True, check=False)
    return done.stdout.splitlines()


def _modules_dep_line(name: str) -> str:
    text = (Path("/lib/modules") / RELEASE / "modules.dep").read_text()
    return next((line for line in text.splitlines()
                 if kmod.module_name(line.split(":")[0]) == name), "")


def group_flavours(args: dict[str, Any]) -> dict[str, Any]:
    """Each flavour's real nvidia.ko from one repository (--flavour both): load them in turn."""
    out: dict[str, Any] = {"release": RELEASE, "before": observe()}
    for flavour, ko_dir in sorted(args["packages"].items()):
        pkg = package(f"flavours/{flavour}", Path(ko_dir), args["version"], FULL)
        out[flavour] = attempt(lambda pkg=pkg: load.load_package(HOST, pkg))
        out[flavour]["dmesg_nvrm"] = [line for line in _dmesg() if "NVRM" in line][-3:]
    return out


GROUPS = {"main": group_main, "sig_enforce": group_sig_enforce, "flavours": group_flavours,
          "raw_loads": group_raw_loads}

if __name__ == "__main__":
    group, args_path, out_path = sys.argv[1:4]
    WORK.mkdir(parents=True, exist_ok=True)
    results = GROUPS[group](json.loads(Path(args_path).read_text()))
    Path(out_path).write_text(json.dumps(results, indent=1))
