"""/proc/modules and /proc/driver/nvidia/version parsing (the read side of installer.node.kmod)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from installer.node.kmod import ProcModulesError, parse_nvrm_version, parse_proc_modules

REAL_PROC_MODULES = """\
nvidia_uvm 1437696 0 - Live 0xffffffffc1a00000 (POE)
nvidia_drm 77824 0 - Live 0xffffffffc19ea000 (POE)
nvidia_modeset 1306624 1 nvidia_drm, Live 0xffffffffc189c000 (POE)
nvidia 56717312 19 nvidia_uvm,nvidia_modeset, Live 0xffffffffbdc00000 (POE)
drm_kms_helper 212992 1 nvidia_drm, Live 0xffffffffc1818000
drm 614400 4 nvidia_drm,drm_kms_helper, Live 0xffffffffc1760000
loop 32768 0 - Live 0x0000000000000000
"""


class TestProcModules:
    def test_real_listing(self) -> None:
        modules = {m.name: m for m in parse_proc_modules(REAL_PROC_MODULES)}
        assert modules["nvidia"].refcount == 19
        assert modules["nvidia"].used_by == ("nvidia_uvm", "nvidia_modeset")
        assert modules["nvidia_uvm"].used_by == ()
        assert modules["drm"].size == 614400
        assert all(m.state == "Live" for m in modules.values())

    def test_empty_file_means_no_modules(self) -> None:
        assert parse_proc_modules("") == []

    @pytest.mark.parametrize("line", ["nvidia", "nvidia abc 0 - Live 0x0",
                                      "nvidia 1 0 - Dead 0x0", "nvidia 1 x - Live 0x0"])
    def test_malformed_line_is_a_clear_error(self, line: str) -> None:
        with pytest.raises(ProcModulesError) as info:
            parse_proc_modules(f"loop 32768 0 - Live 0x0\n{line}\n")
        assert "line 2" in info.value.message
        assert "--proc-root" in info.value.remedy

    @given(st.text(max_size=400))
    def test_any_text_parses_or_fails_cleanly(self, text: str) -> None:
        try:
            modules = parse_proc_modules(text)
        except ProcModulesError as exc:
            assert "/proc/modules line" in exc.message
        else:
            assert all(m.size >= 0 for m in modules)

    @given(st.lists(st.tuples(st.from_regex(r"[a-z_][a-z0-9_]{0,15}", fullmatch=True),
                              st.integers(0, 2**40), st.integers(0, 1000),
                              st.sampled_from(["Live", "Loading", "Unloading"])),
                    max_size=20))
    def test_round_trip(self, rows: list[tuple[str, int, int, str]]) -> None:
        text = "".join(f"{n} {s} {r} - {st_} 0x0\n" for n, s, r, st_ in rows)
        parsed = parse_proc_modules(text)
        assert [(m.name, m.size, m.refcount, m.state) for m in parsed] == rows


class TestNvrmVersion:
    def test_proprietary(self) -> None:
        text = ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.261.03  "
                "Wed Jul  2 20:08:55 UTC 2025\nGCC version:  gcc version 12.2.0\n")
        driver = parse_nvrm_version(text)
        assert driver is not None
        assert (driver.version, driver.flavour) == ("535.261.03", "proprietary")

    def test_open(self) -> None:
        text = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.14  Release "
                "Build  (dvs-builder@U16-I3-B03-4-3)  Thu Feb 22 01:44:30 UTC 2024\n")
        driver = parse_nvrm_version(text)
        assert driver is not None
        assert (driver.version, driver.flavour) == ("550.54.14", "open")

    def test_aarch64(self) -> None:
        driver = parse_nvrm_version("NVRM version: NVIDIA UNIX aarch64 Kernel Module  "
                                    "570.124.06  Thu Feb 27 2025\n")
        assert driver is not None and driver.version == "570.124.06"

    def test_garbage(self) -> None:
        assert parse_nvrm_version("hello\n") is None
