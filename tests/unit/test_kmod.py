"""Kernel-module facts: errno -> error mapping, /proc/devices, modinfo, names, syscalls."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from installer import errors
from installer.node import kmod, syscalls
from installer.node.host import RealHost, Roots
from installer.stages.load import failures
from installer.testing.kernel import module_file_bytes


def _load_error(code: int, **kwargs: object) -> errors.InstallerError:
    return failures.load_failure(OSError(code, "x"), "nvidia", **kwargs)  # type: ignore[arg-type]


class TestLoadErrnoMapping:
    """Each errno the kernel returns becomes its own error, exit code and remedy."""

    @pytest.mark.parametrize(("code", "cls", "exit_code", "words"), [
        (errno.EEXIST, errors.ModuleAlreadyLoadedError, 9, "already loaded"),
        (errno.ENODEV, errors.NoGpuRespondedError, 9, "no NVIDIA GPU responded"),
        (errno.EKEYREJECTED, errors.SignatureRejectedError, 8, "signature"),
        (errno.ENOKEY, errors.SignatureRejectedError, 8, "signature"),
        (errno.ENOENT, errors.ModuleDependencyError, 9, "depends on is not loaded"),
        (errno.EBUSY, errors.ModuleInUseError, 10, "busy"),
        (errno.EAGAIN, errors.ModuleInUseError, 10, "busy"),
        (errno.EPERM, errors.ModulePermissionError, 9, "not permitted"),
        (errno.ENOSYS, errors.KernelWithoutModulesError, 4, "cannot load modules"),
        (errno.ENOEXEC, errors.ModuleLoadError, 9, "invalid module format"),
        (errno.ENOMEM, errors.ModuleLoadError, 9, "ENOMEM"),
    ])
    def test_errno(self, code: int, cls: type[errors.InstallerError], exit_code: int,
                   words: str) -> None:
        error = _load_error(code)
        assert type(error) is cls
        assert error.code == exit_code
        assert words in error.message
        assert error.remedy and error.remedy != errors.InstallerError.default_remedy

    def test_signature_rejection_names_errno_129(self) -> None:
        assert "129" in _load_error(errno.EKEYREJECTED).message

    def test_missing_dependency_is_named(self) -> None:
        error = _load_error(errno.ENOENT, missing=("drm", "drm_kms_helper"))
        assert "drm, drm_kms_helper" in error.message

    def test_permission_remedy_mentions_privilege_and_lockdown(self) -> None:
        remedy = _load_error(errno.EPERM).remedy
        assert "privileged" in remedy and "lockdown" in remedy

    @pytest.mark.parametrize("code", [errno.EOPNOTSUPP, errno.EINVAL, errno.ENOEXEC])
    def test_compressed_module_on_kernel_without_decompression(self, code: int) -> None:
        error = _load_error(code, compressed=True)
        assert isinstance(error, errors.CompressedModuleError)
        assert "decompress" in error.message


class TestUnloadErrnoMapping:
    @pytest.mark.parametrize(("code", "cls"), [
        (errno.EAGAIN, errors.ModuleInUseError), (errno.EBUSY, errors.ModuleInUseError),
        (errno.EPERM, errors.ModulePermissionError),
        (errno.ENOSYS, errors.KernelWithoutModulesError), (errno.EIO, errors.ModuleLoadError),
    ])
    def test_errno(self, code: int, cls: type[errors.InstallerError]) -> None:
        assert type(failures.unload_failure(OSError(code, "x"), "nvidia")) is cls


class TestProcDevices:
    def test_char_section_only(self) -> None:
        text = ("Character devices:\n  1 mem\n195 nvidia-frontend\n508 nvidia-uvm\n"
                "509 nvidia-caps\n\nBlock devices:\n  8 sd\n259 blkext\n")
        majors = kmod.parse_char_majors(text)
        assert majors == {"mem": 1, "nvidia-frontend": 195, "nvidia-uvm": 508,
                          "nvidia-caps": 509}


class TestModuleFiles:
    def test_modinfo_from_elf(self) -> None:
        data = module_file_bytes("nvidia_drm", "535.261.03", ("nvidia_modeset", "drm"))
        info = kmod.modinfo(data)
        assert info["name"] == ["nvidia_drm"] and info["version"] == ["535.261.03"]
        assert kmod.modinfo_depends(data) == ("nvidia_modeset", "drm")

    def test_not_elf(self) -> None:
        with pytest.raises(ValueError, match="not an ELF"):
            kmod.modinfo(b"hello")
        assert kmod.modinfo_depends(b"hello") == ()

    def test_signature_marker(self) -> None:
        assert kmod.is_signed(module_file_bytes("nvidia", "1", signed=True))
        assert not kmod.is_signed(module_file_bytes("nvidia", "1"))

    @pytest.mark.parametrize(("file_name", "name"), [
        ("nvidia-uvm.ko", "nvidia_uvm"), ("kernel/drivers/gpu/drm/drm.ko.xz", "drm"),
        ("drm_kms_helper.ko.zst", "drm_kms_helper"), ("nvidia.ko", "nvidia"),
    ])
    def test_module_name(self, file_name: str, name: str) -> None:
        assert kmod.module_name(file_name) == name

    def test_compressed(self) -> None:
        assert kmod.is_compressed(Path("drm.ko.zst"))
        assert not kmod.is_compressed(Path("drm.ko"))


class TestSyscalls:
    def test_numbers_per_arch(self) -> None:
        assert syscalls.SYSCALLS == {"x86_64": (313, 176), "aarch64": (273, 106)}

    def test_unknown_arch_is_unsupported(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(syscalls.platform, "machine", lambda: "riscv64")
        with pytest.raises(errors.UnsupportedNodeError, match="riscv64"):
            syscalls.delete_module("nvidia")

    def test_delete_of_absent_module_reports_the_kernel_errno(self) -> None:
        """A real syscall: ENOENT (not loaded), or ENOSYS/EPERM where modules are absent."""
        with pytest.raises(OSError) as caught:
            syscalls.delete_module("gni_no_such_module")
        assert caught.value.errno in (errno.ENOENT, errno.ENOSYS, errno.EPERM)


class TestModuleState:
    def test_sysfs_state(self, tmp_path: Path) -> None:
        base = tmp_path / "sys" / "module" / "nvidia"
        (base / "holders" / "nvidia_uvm").mkdir(parents=True)
        (base / "refcnt").write_text("2\n")
        (base / "initstate").write_text("live\n")
        (base / "version").write_text("535.261.03\n")
        host = RealHost(Roots(tmp_path, tmp_path / "proc", tmp_path / "sys", tmp_path / "dev"))
        state = kmod.module_state(host, "nvidia")
        assert state == kmod.ModuleState("nvidia", "535.261.03", 2, "live", ("nvidia_uvm",))
        assert state.users_outside_modules == 1
        assert kmod.module_state(host, "nvidia-uvm") is None
