"""The load stage's five real-kernel cases, against Debian's kernel under qemu.

Two guest boots serve all cases (a boot is ~12 s under TCG): one plain, one booted with
`module.sig_enforce=1`. Inside, tests/kernel/scenarios.py drives the installer's real
kernel code (RealHost: finit_module/delete_module via ctypes, mknod on devtmpfs) and
records what it saw; the tests below assert on those observations.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from . import guest, signed
from .assets import Kernel
from .conftest import REPO

# Cold, the first test also builds NVIDIA's module (minutes on 2 busy cores) in its setup.
pytestmark = pytest.mark.timeout(1800)


def _run_group(kernel: Kernel, out: Path, group: str, args: dict[str, str], *,
               cmdline: str = "") -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    (out / "args.json").write_text(json.dumps(args))
    script = (f'"{sys.executable}" tests/kernel/scenarios.py {group} '
              f'"$GNI_OUT/args.json" "$GNI_OUT/results.json"\n')
    result = guest.run_in_guest(script, kernel=kernel, cmdline=cmdline, timeout=600,
                                cwd=REPO, env={"PYTHONPATH": str(REPO)}, out_dir=out)
    assert result.rc == 0, result.describe()
    data: dict[str, Any] = result.json("results.json")
    data["_wall_s"] = result.wall_s
    return data


@pytest.fixture(scope="session")
def main_group(kernel: Kernel, test_modules: dict[str, Path], nvidia_real: Path,
               tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    args = {"real_nvidia": str(nvidia_real), "test_535": str(test_modules["535.261.03"]),
            "test_550": str(test_modules["550.54.14"])}
    return _run_group(kernel, tmp_path_factory.mktemp("guest-main"), "main", args)


@pytest.fixture(scope="session")
def sig_group(kernel: Kernel, test_modules: dict[str, Path],
              tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("signed")
    vendor, original = signed.vendor_attached(kernel, work)
    args = {"test_535": str(test_modules["535.261.03"]),
            "product_signed": str(signed.product_signed(test_modules["535.261.03"], work)),
            "vendor_attached": str(vendor), "vendor_file": original.name}
    return _run_group(kernel, tmp_path_factory.mktemp("guest-sig"), "sig_enforce", args,
                      cmdline="module.sig_enforce=1")


def _ok(step: dict[str, Any]) -> dict[str, Any]:
    assert "error" not in step, step.get("error")
    result: dict[str, Any] = step["result"]
    return result


class TestTestModulesLoad:
    """Case 1: the test nvidia + nvidia-uvm load with parameters; nodes; idempotent rerun."""

    def test_loaded_with_parameters(self, main_group: dict[str, Any]) -> None:
        result = _ok(main_group["fresh"])
        assert result["loaded"] == ["nvidia", "nvidia_uvm"]
        after = main_group["fresh"]["after"]
        assert {"nvidia", "nvidia_uvm"} <= set(after["modules"])
        assert after["versions"] == {"nvidia": "535.261.03", "nvidia_uvm": "535.261.03"}
        # operator's value for one, the package default for another, the module's own third
        assert main_group["fresh_params"] == {"NVreg_EnableMSI": "0",
                                              "NVreg_DeviceFileMode": "438",
                                              "NVreg_EnableGpuFirmware": "18"}

    def test_device_nodes_have_the_kernels_numbers(self, main_group: dict[str, Any]) -> None:
        after = main_group["fresh"]["after"]
        nodes, majors = after["nodes"], after["devices"]
        assert majors["nvidia-frontend"] == 195
        assert nodes["nvidiactl"] == [195, 255, 0o666]
        assert nodes["nvidia0"] == [195, 0, 0o666]  # "Device Minor: 0" of the fake GPU
        uvm = majors["nvidia-uvm"]
        assert uvm != 195
        assert nodes["nvidia-uvm"] == [uvm, 0, 0o666]
        assert nodes["nvidia-uvm-tools"] == [uvm, 1, 0o666]
        caps = majors["nvidia-caps"]
        assert nodes["nvidia-caps/nvidia-cap1"] == [caps, 1, 0o400]
        assert after["char_links"]["195:255"] == "../nvidiactl"
        assert after["char_links"][f"{uvm}:0"] == "../nvidia-uvm"
        assert _ok(main_group["fresh"])["device_nodes"]["created"][-1] == "nvidia-uvm"

    def test_second_run_changes_nothing(self, main_group: dict[str, Any]) -> None:
        result = _ok(main_group["second"])
        assert result["changed"] is False
        assert result["loaded"] == [] and result["unloaded"] == []
        assert result["kept"] == ["nvidia", "nvidia_uvm"]
        assert main_group["second_inodes"] == main_group["fresh_inodes"]


class TestVersionChange:
    """Case 2: another version replaces the loaded one unless a process holds it."""

    def test_replaced(self, main_group: dict[str, Any]) -> None:
        result = _ok(main_group["change"])
        assert result["unloaded"] == ["nvidia_uvm", "nvidia"]
        assert result["loaded"] == ["nvidia", "nvidia_uvm"]
        after = main_group["change"]["after"]
        assert after["versions"] == {"nvidia": "550.54.14", "nvidia_uvm": "550.54.14"}
        assert "550.54.14" in after["nvrm"]

    def test_in_use_names_the_pid_and_unloads_nothing(self, main_group: dict[str, Any]
                                                      ) -> None:
        error = main_group["in_use"]["error"]
        assert (error["type"], error["code"]) == ("ModuleInUseError", 10)
        assert f"{main_group['holder_pid']} (python" in error["message"]
        assert "nothing was unloaded" in error["message"]
        after = main_group["in_use"]["after"]
        assert after["versions"]["nvidia"] == "550.54.14"
        assert "nvidia-uvm" in after["nodes"]

    def test_unload_when_free(self, main_group: dict[str, Any]) -> None:
        step = main_group["unload"]
        assert _ok(step)["unloaded"] == ["nvidia_uvm", "nvidia"]
        assert not {"nvidia", "nvidia_uvm"} & set(step["after"]["modules"])


class TestRealNvidia:
    """Case 3: NVIDIA's real 535.261.03 modules, no GPU: ENODEV, kernel left as it was."""

    def test_no_gpu_responded(self, main_group: dict[str, Any]) -> None:
        error = main_group["real_nvidia"]["error"]
        assert error["type"] == "NoGpuRespondedError", error
        assert error["code"] == 9 and "no NVIDIA GPU responded" in error["message"]
        assert any("NVRM" in line for line in main_group["dmesg_nvrm"])

    def test_cli_exit_code_and_termination_log(self, main_group: dict[str, Any]) -> None:
        cli = main_group["real_nvidia_cli"]
        assert cli["rc"] == 9, cli
        assert cli["termination_log"].startswith("error(module-load-failed): [load] loading "
                                                 "nvidia: no NVIDIA GPU responded")
        assert cli["after"]["modules"] == main_group["before_real"]["modules"]

    def test_kernel_left_as_it_was(self, main_group: dict[str, Any]) -> None:
        before = main_group["before_real"]
        after = main_group["real_nvidia"]["after"]
        assert after["modules"] == before["modules"]  # drm, loaded for it, went again
        assert after["nodes"] == {} and after["devices"] == before["devices"]


class TestSignatureEnforcement:
    """Case 4: under module.sig_enforce=1 preflight refuses; forcing meets errno 129."""

    def test_guest_enforces(self, sig_group: dict[str, Any]) -> None:
        assert sig_group["sig_enforce"] == "Y"

    def test_preflight_refuses_before_touching_the_kernel(self, sig_group: dict[str, Any]
                                                          ) -> None:
        error = sig_group["preflight"]["error"]
        assert (error["type"], error["code"]) == ("SignatureRejectedError", 8)
        assert "unsigned" in error["message"] and "module.sig_enforce" in error["message"]
        assert sig_group["preflight"]["after"]["modules"] == sig_group["before"]["modules"]

    def test_forced_load_gets_the_kernels_rejection(self, sig_group: dict[str, Any]) -> None:
        error = sig_group["forced"]["error"]
        assert (error["type"], error["code"]) == ("SignatureRejectedError", 8)
        assert "EKEYREJECTED" in error["message"] and "129" in error["message"]
        assert "nvidia" not in sig_group["forced"]["after"]["modules"]


class TestSignedByPackageBuild:
    """The kernel parses `package build`'s signatures (same boot as case 4)."""

    def test_product_signature_rejected_for_its_key(self, sig_group: dict[str, Any]) -> None:
        raw = sig_group["raw_product"]
        assert raw["errno"] in (126, 129), raw  # ENOKEY / EKEYREJECTED
        text = "\n".join(raw["dmesg"])
        assert "with unavailable key" in text and "unsigned" not in text, raw
        assert "nvidia" not in raw["modules"]

    def test_unsigned_rejected_as_unsigned(self, sig_group: dict[str, Any]) -> None:
        raw = sig_group["raw_unsigned"]
        assert raw["errno"] == 129, raw
        assert any("unsigned module" in line for line in raw["dmesg"]), raw

    def test_installer_passes_preflight_then_meets_the_kernel(
            self, sig_group: dict[str, Any]) -> None:
        error = sig_group["product_load"]["error"]
        assert (error["type"], error["code"]) == ("SignatureRejectedError", 8), error
        assert "unsigned" not in error["message"]  # preflight saw signatures, the kernel spoke

    def test_vendor_signature_attached_by_package_build_loads(
            self, sig_group: dict[str, Any]) -> None:
        raw = sig_group["raw_vendor"]
        assert raw["errno"] == 0, raw
        assert "crc_itu_t" in raw["modules"]


class TestHostDependency:
    """Case 5: nvidia-drm needs the kernel's drm/drm_kms_helper, found via modules.dep."""

    def test_drm_loaded_from_the_kernels_tree(self, main_group: dict[str, Any]) -> None:
        result = _ok(main_group["drm"])
        assert result["host_modules"] == ["drm", "drm_kms_helper"]
        assert result["loaded"] == ["nvidia", "nvidia_uvm", "nvidia_modeset", "drm",
                                    "drm_kms_helper", "nvidia_drm"]
        after = main_group["drm"]["after"]
        assert {"drm", "drm_kms_helper", "nvidia_drm"} <= set(after["modules"])
        assert after["nodes"]["nvidia-modeset"] == [195, 254, 0o666]
        assert "drm.ko" in main_group["drm_dep_line"]
