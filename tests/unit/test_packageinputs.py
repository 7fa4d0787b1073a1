"""Module load order and the .deb reader of `package build` (installer/packageinputs.py)."""

from __future__ import annotations

import io
import random
import tarfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from installer.packages.builder.inputs import (
    ModuleInfo,
    PackageBuildError,
    extract_deb,
    load_order,
)


def _module(name: str, depends: tuple[str, ...]) -> ModuleInfo:
    return ModuleInfo(name, Path(f"{name}.ko"), depends, "6.1.0-26-cloud-amd64", None, None)


@st.composite
def dags(draw: st.DrawFn) -> list[ModuleInfo]:
    """Modules where each may depend on earlier ones and on host modules (e.g. drm)."""
    count = draw(st.integers(min_value=1, max_value=8))
    names = [f"mod{i}" for i in range(count)]
    modules = []
    for i, name in enumerate(names):
        inner = draw(st.lists(st.sampled_from(names[:i]), unique=True)) if i else []
        host = draw(st.lists(st.sampled_from(["drm", "drm_kms_helper", "video"]), unique=True))
        modules.append(_module(name, tuple(inner + host)))
    return modules


class TestLoadOrder:
    """Dependencies first, whatever order the directory listed the modules in."""

    @given(dags(), st.randoms(use_true_random=False))
    def test_dependencies_come_first_and_order_is_stable(
            self, modules: list[ModuleInfo], rng: random.Random) -> None:
        shuffled = modules[:]
        rng.shuffle(shuffled)
        order = load_order(shuffled)
        assert sorted(m.name for m in order) == sorted(m.name for m in modules)
        seen: set[str] = set()
        names = {m.name for m in modules}
        for module in order:
            assert all(dep in seen for dep in module.depends if dep in names)
            seen.add(module.name)
        assert [m.name for m in load_order(modules)] == [m.name for m in order]

    def test_nvidia_order_among_ready_modules(self) -> None:
        modules = [_module("nvidia_drm", ("nvidia", "nvidia_modeset", "drm")),
                   _module("nvidia_modeset", ("nvidia",)), _module("nvidia_uvm", ("nvidia",)),
                   _module("nvidia", ("drm",)), _module("nvidia_peermem", ("nvidia",))]
        assert [m.name for m in load_order(modules)] == [
            "nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm"]

    def test_cycle_is_refused(self) -> None:
        with pytest.raises(PackageBuildError, match="cycle"):
            load_order([_module("a", ("b",)), _module("b", ("a",))])


def _ar(members: list[tuple[str, bytes]]) -> bytes:
    out = io.BytesIO()
    out.write(b"!<arch>\n")
    for name, data in members:
        header = f"{name:<16}{0:<12}{0:<6}{0:<6}{'100644':<8}{len(data):<10}`\n"
        out.write(header.encode() + data + (b"\n" if len(data) % 2 else b""))
    return out.getvalue()


def _tar(entries: list[tarfile.TarInfo], payload: bytes = b"x") -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for info in entries:
            archive.addfile(info, io.BytesIO(payload) if info.isfile() else None)
    return buffer.getvalue()


def _file(name: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = 1
    return info


def _link(name: str, target: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = tarfile.SYMTYPE, target
    return info


class TestDebReader:
    """A .deb is an ar archive; its data.tar is unpacked with tarfile's `data` filter."""

    def test_unpacks_data_tar(self, tmp_path: Path) -> None:
        deb = tmp_path / "x.deb"
        deb.write_bytes(_ar([("debian-binary", b"2.0\n"), ("control.tar.gz", _tar([])),
                             ("data.tar.gz", _tar([_file("./usr/lib/libx.so.1")]))]))
        extract_deb(deb, tmp_path / "out")
        assert (tmp_path / "out/usr/lib/libx.so.1").read_bytes() == b"x"

    @pytest.mark.parametrize("entry", [_file("../escape"), _link("usr/evil", "/etc/shadow"),
                                       _link("usr/up", "../../../etc/shadow")])
    def test_unsafe_members_are_refused(self, tmp_path: Path, entry: tarfile.TarInfo) -> None:
        deb = tmp_path / "x.deb"
        deb.write_bytes(_ar([("debian-binary", b"2.0\n"), ("data.tar.gz", _tar([entry]))]))
        with pytest.raises(PackageBuildError, match="cannot unpack"):
            extract_deb(deb, tmp_path / "out")
        assert not (tmp_path / "escape").exists()

    def test_absolute_names_stay_inside_the_target(self, tmp_path: Path) -> None:
        deb = tmp_path / "x.deb"
        deb.write_bytes(_ar([("data.tar.gz", _tar([_file("/gni-test-absolute")]))]))
        extract_deb(deb, tmp_path / "out")
        assert (tmp_path / "out" / "gni-test-absolute").is_file()
        assert not Path("/gni-test-absolute").exists()

    def test_damaged_header_and_missing_data_are_refused(self, tmp_path: Path) -> None:
        deb = tmp_path / "x.deb"
        deb.write_bytes(b"!<arch>\nshort")
        with pytest.raises(PackageBuildError, match="damaged ar header"):
            extract_deb(deb, tmp_path / "out")
        deb.write_bytes(_ar([("debian-binary", b"2.0\n")]))
        with pytest.raises(PackageBuildError, match=r"no data\.tar"):
            extract_deb(deb, tmp_path / "out")
