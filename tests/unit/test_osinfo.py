"""os-release / lsb-release parsing: real files of real distributions, and malformed input."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from installer.node.host import RealHost, Roots
from installer.node.osinfo import HostFileError, parse_key_values, read_os_info
from installer.testing import COS_LSB_RELEASE, OS_RELEASES


def _host(root: Path) -> RealHost:
    return RealHost(Roots(root, root / "proc", root / "sys", root / "dev"))


class TestParse:
    """The freedesktop format: KEY=value, quotes, comments."""

    def test_quotes_and_escapes(self) -> None:
        text = 'A="x y"\nB=\'single quoted\'\n# comment\n\nC=plain\nD="a \\"b\\" c"\n'
        assert parse_key_values(text, source="t") == {
            "A": "x y", "B": "single quoted", "C": "plain", "D": 'a "b" c'}

    def test_unquoted_value_with_space_is_kept(self) -> None:
        assert parse_key_values(COS_LSB_RELEASE, source="lsb")[
            "CHROMEOS_RELEASE_BUILD_TYPE"] == "Official Build"

    @pytest.mark.parametrize("bad", ["no equals sign", "1KEY=x", "KEY WITH SPACE=x",
                                     'A="unterminated'])
    def test_malformed_line_names_file_and_line(self, bad: str) -> None:
        with pytest.raises(HostFileError) as info:
            parse_key_values(f"OK=1\n{bad}\n", source="/etc/os-release")
        assert "/etc/os-release line 2" in info.value.message
        assert info.value.code == 4

    @given(st.text(max_size=300))
    def test_any_text_parses_or_fails_cleanly(self, text: str) -> None:
        try:
            values = parse_key_values(text, source="fuzz")
        except HostFileError as exc:
            assert "fuzz line" in exc.message
        else:
            assert all(isinstance(k, str) and isinstance(v, str) for k, v in values.items())

    @given(st.dictionaries(st.from_regex(r"[A-Z_][A-Z0-9_]{0,10}", fullmatch=True),
                           st.text(alphabet=st.characters(blacklist_categories=("Cc", "Cs"),
                                                          blacklist_characters="\"\\`$"),
                                   max_size=20)))
    def test_quoted_values_round_trip(self, values: dict[str, str]) -> None:
        text = "".join(f'{k}="{v}"\n' for k, v in values.items())
        parsed = parse_key_values(text, source="rt")
        assert {k: " ".join(v.split()) for k, v in parsed.items()} == {
            k: " ".join(v.split()) for k, v in values.items()}


class TestReadOsInfo:
    """Reading through the host seam, including the COS milestone and build."""

    @pytest.mark.parametrize(("name", "os_id", "version", "family"), [
        ("cos", "cos", "109", "cos"),
        ("ubuntu-22.04", "ubuntu", "22.04", "ubuntu"),
        ("debian-12", "debian", "12", "debian"),
        ("rocky-9", "rocky", "9.3", "rhel"),
        ("al2023", "amzn", "2023", "amzn"),
    ])
    def test_distributions(self, tmp_path: Path, name: str, os_id: str, version: str,
                           family: str) -> None:
        (tmp_path / "etc").mkdir()
        (tmp_path / "etc" / "os-release").write_text(OS_RELEASES[name])
        info = read_os_info(_host(tmp_path))
        assert (info.id, info.version_id, info.family) == (os_id, version, family)

    def test_cos_milestone_and_build_from_lsb_release(self, tmp_path: Path) -> None:
        (tmp_path / "etc").mkdir()
        (tmp_path / "etc" / "os-release").write_text("ID=cos\nNAME=COS\n")
        (tmp_path / "etc" / "lsb-release").write_text(COS_LSB_RELEASE)
        info = read_os_info(_host(tmp_path))
        assert (info.cos_milestone, info.cos_build) == ("109", "17800.218.20")

    def test_absolute_symlink_resolves_inside_host_root(self, tmp_path: Path) -> None:
        """/etc/os-release -> /usr/lib/os-release must not read this container's file."""
        (tmp_path / "usr" / "lib").mkdir(parents=True)
        (tmp_path / "usr" / "lib" / "os-release").write_text('ID=rocky\nVERSION_ID="9.3"\n')
        (tmp_path / "etc").mkdir()
        (tmp_path / "etc" / "os-release").symlink_to("/usr/lib/os-release")
        assert read_os_info(_host(tmp_path)).id == "rocky"

    def test_missing_os_release_is_unsupported_node(self, tmp_path: Path) -> None:
        with pytest.raises(HostFileError.__mro__[1]) as info:
            read_os_info(_host(tmp_path))
        assert "no os-release" in info.value.message
        assert info.value.code == 4
