"""One boot of the tier's kernel, booted with `module.sig_enforce=1`, checks two things.

The guest harness itself: the right kernel boots, the script's exit code, stdout, files and
the kernel's cmdline come back, and a write to the root stays in the guest.

MIG on a real kernel: the MIG capability device nodes, made on the guest's devtmpfs with the
major of `nvidia-caps` and the minors of `mig-minors`, as GKE's device plugin reads them
(`/dev/nvidia-caps/nvidia-cap<N>`); a rerun keeps them (tests/kernel/mig_caps_guest.py: mknod
through the seam, no module loaded, so signature enforcement does not touch it).

The MIG script runs first with its exit code and output recorded, then the harness lines,
whose `exit 7` ends the script: each test reads the same boot's results.
"""

from __future__ import annotations

import os
import sys

import pytest

from . import guest
from .assets import Kernel
from .conftest import REPO

MIG_SCRIPT = f'"{sys.executable}" tests/kernel/mig_caps_guest.py "$GNI_OUT"'

HARNESS_SCRIPT = """
uname -r > "$GNI_OUT/release"
cat /proc/cmdline > "$GNI_OUT/cmdline"
cat /sys/module/module/parameters/sig_enforce > "$GNI_OUT/sig_enforce"
test -f "/lib/modules/$(uname -r)/modules.dep" && echo yes > "$GNI_OUT/modules_dep"
test -r /proc/modules && echo yes > "$GNI_OUT/proc_modules"
touch /usr/gni-guest-write-stays-in-guest
echo to-stdout
exit 7
"""


@pytest.fixture(scope="module")
def boot(kernel: Kernel, tmp_path_factory: pytest.TempPathFactory) -> guest.GuestResult:
    """The one boot: the MIG script (its exit code in mig.rc), then the harness checks."""
    script = f'{MIG_SCRIPT}\necho $? > "$GNI_OUT/mig.rc"\n{HARNESS_SCRIPT}'
    return guest.run_in_guest(script, kernel=kernel, cmdline="module.sig_enforce=1",
                              timeout=300, cwd=REPO, env={"PYTHONPATH": str(REPO)},
                              out_dir=tmp_path_factory.mktemp("guest"))


class TestGuestHarness:
    """The boot checks everything the scenario tests rely on."""

    def test_boot_reports_rc_files_and_kernel_state(
        self, boot: guest.GuestResult, kernel: Kernel
    ) -> None:
        result = boot
        assert result.rc == 7, result.describe()
        assert "to-stdout" in result.stdout
        assert (result.files / "release").read_text().strip() == kernel.release
        assert "module.sig_enforce=1" in (result.files / "cmdline").read_text()
        assert (result.files / "sig_enforce").read_text().strip() == "Y"
        assert (result.files / "modules_dep").read_text().strip() == "yes"
        assert (result.files / "proc_modules").read_text().strip() == "yes"
        assert not os.path.exists("/usr/gni-guest-write-stays-in-guest")


class TestMigCapNodes:
    """The MIG capability nodes, on the same boot."""

    def test_cap_nodes_have_the_tables_numbers(self, boot: guest.GuestResult) -> None:
        result = boot
        rc = (result.files / "mig.rc").read_text().strip() if (
            result.files / "mig.rc").is_file() else None
        assert rc == "0", result.describe()
        data = result.json("results.json")
        nodes, expected = data["nodes"], data["expected"]
        for gi in range(7, 14):
            for key in (f"gpu0/gi{gi}/access", f"gpu0/gi{gi}/ci0/access"):
                name = f"nvidia-caps/nvidia-cap{expected[key]}"
                assert nodes[name] == {"char": True, "major": 237, "minor": expected[key],
                                       "mode": 0o444, "link": f"../{name}"}, key
        assert nodes["nvidia-caps/nvidia-cap1"]["mode"] == 0o400  # MIG config: root only
        assert len(nodes) == 2 + 7 * 2
        assert sorted(data["created"]) == sorted(nodes)
        assert sorted(data["kept_on_rerun"]) == sorted(nodes)
        assert not data["changed_on_rerun"]
        assert set(data["record"]["nodes"]) == set(nodes)  # recorded as ours, this boot
