"""The guest harness itself: the right kernel boots, exit codes, files and cmdline come back."""

from __future__ import annotations

from .assets import Kernel
from .conftest import GuestRunner


class TestGuestHarness:
    """One boot checks everything the scenario tests rely on."""

    def test_boot_reports_rc_files_and_kernel_state(
        self, run_guest: GuestRunner, kernel: Kernel
    ) -> None:
        script = """
        uname -r > "$GNI_OUT/release"
        cat /proc/cmdline > "$GNI_OUT/cmdline"
        cat /sys/module/module/parameters/sig_enforce > "$GNI_OUT/sig_enforce"
        test -f "/lib/modules/$(uname -r)/modules.dep" && echo yes > "$GNI_OUT/modules_dep"
        test -r /proc/modules && echo yes > "$GNI_OUT/proc_modules"
        touch /usr/gni-guest-write-stays-in-guest
        echo to-stdout
        exit 7
        """
        result = run_guest(script, cmdline="module.sig_enforce=1", timeout=180)
        assert result.rc == 7, result.describe()
        assert "to-stdout" in result.stdout
        assert (result.files / "release").read_text().strip() == kernel.release
        assert "module.sig_enforce=1" in (result.files / "cmdline").read_text()
        assert (result.files / "sig_enforce").read_text().strip() == "Y"
        assert (result.files / "modules_dep").read_text().strip() == "yes"
        assert (result.files / "proc_modules").read_text().strip() == "yes"
        assert not __import__("os").path.exists("/usr/gni-guest-write-stays-in-guest")
