"""The load stage over host trees with a simulated kernel: every path the issue names."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from click.testing import CliRunner

from installer import errors
from installer.cli import cli
from installer.config import ModuleParam
from installer.node.host import Roots
from installer.packages.manifest import Package
from installer.stages import load
from installer.stages.load import plan as modplan
from installer.testing import SAMPLE_NODES, build_node
from installer.testing.kernel import (
    FakeKernelHost,
    FakeModule,
    ModuleFile,
    fake_module_set,
    module_file_bytes,
    write_host_module,
    write_package,
)

RELEASE = SAMPLE_NODES["gke-ubuntu-t4"].kernel


def _node(tmp_path: Path, name: str = "gke-ubuntu-t4", **kwargs: object) -> FakeKernelHost:
    root = build_node(tmp_path / "node", SAMPLE_NODES[name])
    return FakeKernelHost(Roots(root, root / "proc", root / "sys", root / "dev"),
                          **kwargs)  # type: ignore[arg-type]


def _package(tmp_path: Path, version: str, *, signed: bool = False, with_drm: bool = False,
             params: dict[str, str] | None = None, release: str = RELEASE,
             firmware: bool = False) -> Package:
    modules = fake_module_set(tmp_path / f"ko-{version}", version, signed=signed,
                              with_drm=with_drm)
    if params:
        modules[0] = ModuleFile(modules[0].name, modules[0].source, params=params)
    extra = {"firmware/nvidia/535/gsp_tu10x.bin": (b"gsp", "firmware")} if firmware else None
    return write_package(tmp_path / f"pkg-{version}-{signed}-{with_drm}", modules,
                         driver_version=version, kernel_release=release, extra_files=extra)


def _host_drm(host: FakeKernelHost, *, builtin_helper: bool = False,
              suffix: str = ".ko") -> None:
    """The node's own drm and drm_kms_helper (as Debian's 6.1 ships them) + modules.dep."""
    tree = host.roots.host / "lib" / "modules" / RELEASE
    drm = f"kernel/drivers/gpu/drm/drm{suffix}"
    helper = f"kernel/drivers/gpu/drm/drm_kms_helper{suffix}"
    write_host_module(tree, drm, "drm")
    write_host_module(tree, helper, "drm_kms_helper", ["drm"])
    lines = [f"{drm}:"] if builtin_helper else [f"{drm}:", f"{helper}: {drm}"]
    (tree / "modules.dep").write_text("\n".join(lines) + "\n")
    (tree / "modules.builtin").write_text(f"{helper}\n" if builtin_helper else "")


class TestFreshLoad:
    def test_loads_in_order_with_params_and_makes_nodes(self, tmp_path: Path) -> None:
        host = _node(tmp_path)
        package = _package(tmp_path, "535.261.03", params={"NVreg_EnableMSI": "1"})
        params = [ModuleParam("nvidia", "NVreg_EnableMSI", "0"),
                  ModuleParam("nvidia", "NVreg_DeviceFileMode", "438")]
        result = load.load_package(host, package, params=params)
        assert result.loaded == ["nvidia", "nvidia_uvm"]
        assert host.modules["nvidia"].params == "NVreg_EnableMSI=0 NVreg_DeviceFileMode=438"
        assert host.version_of("nvidia_uvm") == "535.261.03"
        assert host.char_device(host.roots.dev / "nvidiactl") == (195, 255, 0o666)
        assert host.char_device(host.roots.dev / "nvidia0") == (195, 0, 0o666)
        assert result.nodes.created[-1] == "nvidia-uvm"
        assert result.changed

    def test_second_run_changes_nothing(self, tmp_path: Path) -> None:
        host = _node(tmp_path)
        package = _package(tmp_path, "535.261.03")
        load.load_package(host, package)
        calls = len(host.calls)
        again = load.load_package(host, package)
        assert not again.changed and again.kept == ["nvidia", "nvidia_uvm"]
        assert host.calls[calls:] == []

    def test_partially_loaded_gets_the_rest(self, tmp_path: Path) -> None:
        host = _node(tmp_path)
        package = _package(tmp_path, "535.261.03")
        host.finit_module(package.path_of("kernel/nvidia.ko"), "")
        result = load.load_package(host, package)
        assert (result.kept, result.loaded) == (["nvidia"], ["nvidia_uvm"])


class TestVersionChange:
    def test_other_version_is_unloaded_and_replaced(self, tmp_path: Path) -> None:
        host = _node(tmp_path)
        load.load_package(host, _package(tmp_path, "535.261.03"))
        result = load.load_package(host, _package(tmp_path, "550.54.14"))
        assert result.unloaded == ["nvidia_uvm", "nvidia"]
        assert result.loaded == ["nvidia", "nvidia_uvm"]
        assert host.version_of("nvidia") == "550.54.14"
        nvrm = (host.roots.proc / "driver" / "nvidia" / "version").read_text()
        assert "550.54.14" in nvrm

    def test_in_use_names_the_pid_and_unloads_nothing(self, tmp_path: Path) -> None:
        host = _node(tmp_path)
        load.load_package(host, _package(tmp_path, "535.261.03"))
        pid = host.open_device("nvidia", "/dev/nvidiactl", comm="python3")
        calls = len(host.calls)
        with pytest.raises(errors.ModuleInUseError) as caught:
            load.load_package(host, _package(tmp_path, "550.54.14"))
        assert f"{pid} (python3)" in caught.value.message
        assert caught.value.code == 10
        assert [c for c in host.calls[calls:] if c[0] == "unload"] == []
        assert host.version_of("nvidia") == "535.261.03"
        assert (host.roots.dev / "nvidia-uvm").exists()

    def test_foreign_holder_module_blocks(self, tmp_path: Path) -> None:
        host = _node(tmp_path)
        load.load_package(host, _package(tmp_path, "535.261.03"))
        other = tmp_path / "gdrdrv.ko"
        other.write_bytes(module_file_bytes("gdrdrv", "2.4", ["nvidia"]))
        host.finit_module(other, "")
        with pytest.raises(errors.ModuleInUseError, match="gdrdrv"):
            load.load_package(host, _package(tmp_path, "550.54.14"))


class TestPreflight:
    def test_signature_enforcement_refuses_unsigned_before_touching_kernel(
            self, tmp_path: Path) -> None:
        host = _node(tmp_path, "rocky9-h100x8")
        package = _package(tmp_path, "535.261.03", release=SAMPLE_NODES["rocky9-h100x8"].kernel)
        with pytest.raises(errors.SignatureRejectedError) as caught:
            load.load_package(host, package)
        assert "unsigned" in caught.value.message and caught.value.code == 8
        assert host.calls == []

    def test_forcing_past_preflight_gets_the_kernels_rejection(self, tmp_path: Path) -> None:
        host = _node(tmp_path, "rocky9-h100x8")
        package = _package(tmp_path, "535.261.03", release=SAMPLE_NODES["rocky9-h100x8"].kernel)
        with pytest.raises(errors.SignatureRejectedError, match="129"):
            load.load_package(host, package, force=True)
        assert host.modules == {}

    def test_signed_package_loads_under_enforcement(self, tmp_path: Path) -> None:
        host = _node(tmp_path, "rocky9-h100x8")
        package = _package(tmp_path, "535.261.03", signed=True,
                           release=SAMPLE_NODES["rocky9-h100x8"].kernel)
        assert load.load_package(host, package).loaded == ["nvidia", "nvidia_uvm"]

    def test_nouveau_bound_gpu_is_refused_with_remedy(self, tmp_path: Path) -> None:
        host = _node(tmp_path, "al2023-nouveau-vfio")
        package = _package(tmp_path, "535.261.03",
                           release=SAMPLE_NODES["al2023-nouveau-vfio"].kernel)
        with pytest.raises(errors.GpuClaimedError) as caught:
            load.load_package(host, package)
        assert "nouveau" in caught.value.message and "blacklist" in caught.value.remedy
        assert host.calls == []

    def test_kernel_mismatch_is_refused(self, tmp_path: Path) -> None:
        """A package for a kernel the node does not run: the kernel is never called."""
        host = _node(tmp_path)
        with pytest.raises(errors.ModuleLoadError, match=r"built for kernel 6\.1\.0-9-amd64"):
            load.load_package(host, _package(tmp_path, "535.261.03", release="6.1.0-9-amd64"))
        assert host.calls == []

    def test_tampered_module_file_is_never_loaded(self, tmp_path: Path) -> None:
        host = _node(tmp_path)
        package = _package(tmp_path, "535.261.03")
        with package.path_of("kernel/nvidia.ko").open("ab") as handle:
            handle.write(b"x")
        with pytest.raises(errors.IntegrityError):
            load.load_package(host, package)
        assert host.calls == []

    def test_kernel_without_modules(self, tmp_path: Path) -> None:
        host = _node(tmp_path)
        (host.roots.proc / "modules").unlink()
        with pytest.raises(errors.KernelWithoutModulesError):
            load.load_package(host, _package(tmp_path, "535.261.03"))


class TestHostDependencies:
    def test_drm_resolved_from_modules_dep_first(self, tmp_path: Path) -> None:
        host = _node(tmp_path)
        _host_drm(host)
        result = load.load_package(host, _package(tmp_path, "535.261.03", with_drm=True))
        assert result.loaded == ["nvidia", "nvidia_uvm", "nvidia_modeset", "drm",
                                 "drm_kms_helper", "nvidia_drm"]
        assert result.host_modules == ["drm", "drm_kms_helper"]
        assert host.char_device(host.roots.dev / "nvidia-modeset") == (195, 254, 0o666)

    def test_builtin_and_loaded_host_modules_are_skipped(self, tmp_path: Path) -> None:
        host = _node(tmp_path)
        _host_drm(host, builtin_helper=True)
        host.finit_module(host.roots.host / "lib/modules" / RELEASE /
                          "kernel/drivers/gpu/drm/drm.ko", "")
        # the fake kernel checks depends= itself: a built-in counts as loaded there
        host.modules["drm_kms_helper"] = FakeModule(None, (), "")
        result = load.load_package(host, _package(tmp_path, "535.261.03", with_drm=True))
        assert "drm" in result.kept and "drm_kms_helper" not in result.loaded

    def test_missing_host_module_is_named(self, tmp_path: Path) -> None:
        host = _node(tmp_path)
        with pytest.raises(errors.ModuleDependencyError, match="drm"):
            load.load_package(host, _package(tmp_path, "535.261.03", with_drm=True))

    def test_compressed_host_module_without_kernel_support(self, tmp_path: Path) -> None:
        host = _node(tmp_path)
        _host_drm(host, suffix=".ko.zst")
        with pytest.raises(errors.CompressedModuleError, match="decompress"):
            load.load_package(host, _package(tmp_path, "535.261.03", with_drm=True))
        assert host.modules == {}

    def test_compressed_host_module_with_kernel_support(self, tmp_path: Path) -> None:
        host = _node(tmp_path, decompresses=True)
        _host_drm(host, suffix=".ko.xz")
        result = load.load_package(host, _package(tmp_path, "535.261.03", with_drm=True))
        assert "drm" in result.host_modules


class TestFailures:
    def test_no_gpu_leaves_the_kernel_as_it_was(self, tmp_path: Path) -> None:
        host = _node(tmp_path)
        _host_drm(host)
        host.fail_next["nvidia"] = errno.ENODEV
        # like the real 535 nvidia.ko on Debian 6.1, nvidia itself needs the host's drm
        ko = tmp_path / "real-like" / "nvidia.ko"
        ko.parent.mkdir()
        ko.write_bytes(module_file_bytes("nvidia", "535.261.03", ["drm"]))
        package = write_package(tmp_path / "pkg", [ModuleFile("nvidia", ko)],
                                driver_version="535.261.03", kernel_release=RELEASE)
        with pytest.raises(errors.NoGpuRespondedError) as caught:
            load.load_package(host, package)
        assert caught.value.code == 9
        assert ("load", "drm.ko") in host.calls and ("unload", "drm") in host.calls
        assert host.modules == {}

    def test_failure_after_some_loads_rolls_back(self, tmp_path: Path) -> None:
        host = _node(tmp_path)
        host.fail_next["nvidia_uvm"] = errno.ENOMEM
        with pytest.raises(errors.ModuleLoadError, match="ENOMEM"):
            load.load_package(host, _package(tmp_path, "535.261.03"))
        assert host.modules == {}


class TestParams:
    def test_unknown_module_is_a_config_error(self, tmp_path: Path) -> None:
        host = _node(tmp_path)
        with pytest.raises(errors.ConfigError, match="nvidia_peermem is not a module"):
            load.load_package(host, _package(tmp_path, "535.261.03"),
                              params=[ModuleParam("nvidia_peermem", "x", "1")])

    def test_params_file(self, tmp_path: Path) -> None:
        path = tmp_path / "params.conf"
        path.write_text("# tuned for MIG\nnvidia.NVreg_EnableMSI=0  # comment\n\n"
                        "nvidia-uvm.uvm_perf_prefetch_enable=0\n")
        assert modplan.read_params_file(path) == [
            ModuleParam("nvidia", "NVreg_EnableMSI", "0"),
            ModuleParam("nvidia_uvm", "uvm_perf_prefetch_enable", "0")]

    def test_params_file_bad_line(self, tmp_path: Path) -> None:
        path = tmp_path / "params.conf"
        path.write_text("nvidia.NVreg_X = 1\n")
        with pytest.raises(errors.ConfigError, match="line 1"):
            modplan.read_params_file(path)


class TestFirmware:
    def test_firmware_path_points_at_the_install_dir(self, tmp_path: Path) -> None:
        host = _node(tmp_path)
        param = host.roots.sys / "module" / "firmware_class" / "parameters" / "path"
        param.parent.mkdir(parents=True)
        param.write_text("\n")
        result = load.load_package(host, _package(tmp_path, "535.261.03", firmware=True),
                                   firmware_dir="/home/kubernetes/bin/nvidia/firmware")
        assert param.read_text() == "/home/kubernetes/bin/nvidia/firmware"
        assert result.firmware_path == "/home/kubernetes/bin/nvidia/firmware"


class TestUnloadCommand:
    def test_unload_then_nothing_loaded(self, tmp_path: Path) -> None:
        host = _node(tmp_path)
        load.load_package(host, _package(tmp_path, "535.261.03"))
        result = load.unload(host)
        assert result.unloaded == ["nvidia_uvm", "nvidia"]
        assert host.modules == {} and not (host.roots.dev / "nvidia-uvm").exists()
        assert load.unload(host).unloaded == []

    def test_cli_unload_in_use_exits_10(self, tmp_path: Path) -> None:
        host = _node(tmp_path)
        load.load_package(host, _package(tmp_path, "535.261.03"))
        host.open_device("nvidia")
        root = host.roots.host
        runner = CliRunner()
        outcome = runner.invoke(
            cli, ["unload", "--host-root", str(root), "--proc-root", str(root / "proc"),
                  "--sys-root", str(root / "sys"), "--termination-log", str(tmp_path / "t"),
                  "--log-format", "json"],
            obj={"host_factory": lambda roots: host})
        assert outcome.exit_code == 10, outcome.output
        assert "module-in-use" in outcome.output
        assert host.version_of("nvidia") == "535.261.03"


class TestLoadCommand:
    """`gpu-node-installer load`: fetch from a preloaded dir, then load; exit codes."""

    def _invoke(self, tmp_path: Path, host: FakeKernelHost, pre: Path) -> tuple[int, str]:
        root = host.roots.host
        outcome = CliRunner().invoke(
            cli, ["load", "--host-root", str(root), "--proc-root", str(root / "proc"),
                  "--sys-root", str(root / "sys"), "--preloaded-dir", str(pre),
                  "--driver-version", "535.261.03", "--flavour", "proprietary",
                  "--module-param", "nvidia.NVreg_EnableMSI=0",
                  "--termination-log", str(tmp_path / "termination-log"),
                  "--log-format", "json", "--output", "json"],
            obj={"host_factory": lambda roots: host})
        return outcome.exit_code, outcome.output

    def _preloaded(self, tmp_path: Path) -> Path:
        pre = tmp_path / "preloaded"
        write_package(pre / RELEASE / "535.261.03" / "proprietary",
                      fake_module_set(tmp_path / "ko", "535.261.03"),
                      driver_version="535.261.03", kernel_release=RELEASE)
        return pre

    def test_load_then_rerun_is_unchanged(self, tmp_path: Path) -> None:
        host = _node(tmp_path)
        pre = self._preloaded(tmp_path)
        code, output = self._invoke(tmp_path, host, pre)
        assert code == 0, output
        assert host.modules["nvidia"].params == "NVreg_EnableMSI=0"
        code, output = self._invoke(tmp_path, host, pre)
        assert code == 0 and '"changed": false' in output

    def test_no_gpu_exit_code_and_termination_log(self, tmp_path: Path) -> None:
        host = _node(tmp_path)
        host.fail_next["nvidia"] = errno.ENODEV
        code, _ = self._invoke(tmp_path, host, self._preloaded(tmp_path))
        assert code == 9
        line = (tmp_path / "termination-log").read_text()
        assert line.startswith("error(module-load-failed): [load] loading nvidia: no NVIDIA GPU")
        assert host.modules == {}


class TestFlavourChange:
    def test_same_version_other_flavour_is_replaced(self, tmp_path: Path) -> None:
        host = _node(tmp_path)
        load.load_package(host, _package(tmp_path, "535.261.03"))
        version_file = host.roots.proc / "driver" / "nvidia" / "version"
        version_file.write_text("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  "
                                "535.261.03  Release Build\n")
        result = load.load_package(host, _package(tmp_path, "535.261.03"))
        assert result.unloaded == ["nvidia_uvm", "nvidia"]
        assert result.loaded == ["nvidia", "nvidia_uvm"]
