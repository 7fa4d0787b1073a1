"""Hostile package tarballs: every header is checked before a byte is
written, against the generic bounds and the manifest's member list; a tarball is unpacked once.

Each case puts one tarball in a preloaded dir (beside the node, as an image would) and runs
`install`: exit 7, one line naming the tarball and the member, no traceback, nothing written
outside the work area (the cache's per-run temp area, emptied when the run ends).
"""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from adversarial.harness import VERSION, Arena, Result, install_preloaded, refused_untouched, settle

GIB = 1024**3
Member = tuple[tarfile.TarInfo, bytes | None]


def _package(arena: Arena) -> Path:
    return next(arena.scene.repo.glob("*/*/*/manifest.json")).parent


def _members(arena: Arena) -> list[Member]:
    """The package as tar members, manifest first (as `package build --tarball` sorts it)."""
    root = _package(arena)
    paths = sorted(p for p in root.rglob("*") if p.is_file())
    paths.sort(key=lambda p: p.name != "manifest.json")
    return [_file(str(p.relative_to(root)), p.read_bytes()) for p in paths]


def _file(name: str, data: bytes) -> Member:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    return info, data


def _special(name: str, kind: bytes, link: str = "") -> Member:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    return info, None


def _claim(name: str, size: int) -> Member:
    """A header that claims `size` bytes with none of them behind it."""
    info = tarfile.TarInfo(name)
    info.size = size
    return info, b""


def _write(path: Path, members: list[Member], *, fmt: int = tarfile.PAX_FORMAT,
           holes: int = 0) -> Path:
    """Raw headers and data, so a header may lie about what follows it; with `holes`, a
    claim is followed by a hole of its size (a sparse file: seekable, costs no disk)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as out:
        for info, data in members:
            out.write(info.tobuf(fmt, "utf-8", "surrogateescape"))
            if data:
                out.write(data + b"\0" * (-len(data) % 512))
            elif holes and info.isfile():
                out.seek(info.size + (-info.size % 512), io.SEEK_CUR)
        out.write(b"\0" * 1024)
    return path


def _tarball(arena: Arena, members: list[Member], **kwargs: int) -> Path:
    """The preloaded dir: in the arena, or beside it for a sparse tarball of many GiB (the
    snapshot hashes every file of the arena)."""
    preloaded = arena.base.with_name("sparse") if kwargs.get("holes") else \
        arena.base / "preloaded"
    kernel, version, flavour = _package(arena).relative_to(arena.scene.repo).parts
    _write(preloaded / kernel / version / f"{flavour}.tar", members, **kwargs)
    return preloaded


def _refused(arena: Arena, members: list[Member], *causes: str, **kwargs: int) -> Result:
    preloaded = _tarball(arena, members, **kwargs)
    settle(arena)
    result = refused_untouched(arena, lambda: install_preloaded(arena, preloaded), 7,
                               "tarball", *causes)
    assert not list(_big_files(arena.base)), list(_big_files(arena.base))
    return result


def _big_files(top: Path) -> Iterator[Path]:
    return (p for p in top.rglob("*") if p.is_file() and p.stat().st_size > 64 * 1024 * 1024)


def test_a_good_tarball_installs(arena: Arena) -> None:
    preloaded = _tarball(arena, _members(arena))
    done = install_preloaded(arena, preloaded)
    assert done.code == 0, done.stderr[-2000:]
    assert json.loads((arena.install_dir / ".state.json").read_text())["driver_version"] == \
        VERSION


def test_a_small_tarball_claiming_a_huge_extra_member(arena: Arena) -> None:
    members = [*_members(arena), _claim("lib64/libhuge.so", 6 * GIB)]
    _refused(arena, members, "'lib64/libhuge.so' is not in the manifest")


def test_a_listed_member_claiming_more_than_the_manifest_says(arena: Arena) -> None:
    members = _members(arena)
    name = members[1][0].name
    members[1] = _claim(name, 4 * GIB)
    _refused(arena, members, f"member {name!r} claims {4 * GIB} bytes, the manifest says")


def test_a_member_beyond_the_size_limit_before_the_manifest(arena: Arena) -> None:
    members = [_claim("lib64/libhuge.so", 100 * GIB), *_members(arena)]
    _refused(arena, members, "'lib64/libhuge.so' claims", "beyond the size limits")


def test_members_beyond_the_total_limit(arena: Arena) -> None:
    members = [_claim(f"junk/{i}", 7 * GIB) for i in range(5)]
    _refused(arena, members, "'junk/4' claims", "beyond the size limits", holes=1)


def test_duplicate_member(arena: Arena) -> None:
    members = _members(arena)
    _refused(arena, [*members, members[1]], f"duplicate member {members[1][0].name!r}")


def test_a_file_and_a_directory_of_one_name(arena: Arena) -> None:
    members = _members(arena)
    folder = tarfile.TarInfo(members[1][0].name)
    folder.type = tarfile.DIRTYPE
    _refused(arena, [*members, (folder, None)], "duplicate member")


@pytest.mark.parametrize(("member", "kind"), [
    (_special("lib64/libcuda.so.1", tarfile.LNKTYPE, "manifest.json"), "a hard link"),
    (_special("lib64/libcuda.so.1", tarfile.SYMTYPE, "/etc/shadow"), "a symbolic link"),
    (_special("dev/nvidia0", tarfile.CHRTYPE), "a character device"),
    (_special("dev/sda", tarfile.BLKTYPE), "a block device"),
    (_special("pipe", tarfile.FIFOTYPE), "a FIFO"),
])
def test_links_and_devices(arena: Arena, member: Member, kind: str) -> None:
    _refused(arena, [*_members(arena), member], f"is {kind}", "no link or device")


def test_gnu_sparse_member(arena: Arena) -> None:
    info = tarfile.TarInfo("lib64/sparse.so")
    info.type = tarfile.GNUTYPE_SPARSE
    info.size = 0
    _refused(arena, [*_members(arena), (info, None)], "'lib64/sparse.so' is a sparse file",
             fmt=tarfile.GNU_FORMAT)


def test_pax_sparse_member(arena: Arena) -> None:
    info = tarfile.TarInfo("lib64/sparse.so")
    info.size = 512
    info.pax_headers = {"GNU.sparse.size": str(8 * GIB), "GNU.sparse.map": "0,512"}
    _refused(arena, [(info, b"\0" * 512), *_members(arena)], "is a sparse file")


@pytest.mark.parametrize(("name", "cause"), [
    ("/etc/cron.d/evil", "must be relative"),
    ("../../../etc/cron.d/evil", "'..'"),
    ("lib64/../../escape", "'..'"),
    ("lib64/evil\nname", "control characters"),
])
def test_escaping_or_odd_names(arena: Arena, name: str, cause: str) -> None:
    result = _refused(arena, [*_members(arena), _file(name, b"x")], cause)
    assert not (arena.base / "escape").exists()
    assert "\n" not in result.lines[0]


def test_a_member_not_in_the_manifest(arena: Arena) -> None:
    _refused(arena, [*_members(arena), _file("lib64/extra.so", b"\x7fELF")],
             "'lib64/extra.so' is not in the manifest")


def test_a_listed_file_missing_from_the_tarball(arena: Arena) -> None:
    members = _members(arena)
    _refused(arena, members[:-1], f"the manifest lists {members[-1][0].name!r}",
             "tarball lacks it")


def test_no_manifest(arena: Arena) -> None:
    _refused(arena, _members(arena)[1:], "has no manifest.json")


def test_a_malformed_manifest_inside(arena: Arena) -> None:
    members = _members(arena)
    members[0] = _file("manifest.json", b'{"schema_version": NaN}')
    _refused(arena, members, "manifest.json from tarball", "NaN")


def test_not_a_tarball(arena: Arena) -> None:
    preloaded = arena.base / "preloaded"
    kernel, version, flavour = _package(arena).relative_to(arena.scene.repo).parts
    bogus = preloaded / kernel / version / f"{flavour}.tar.gz"
    bogus.parent.mkdir(parents=True)
    bogus.write_bytes(b"\x1f\x8b\x08\x00 not really gzip")
    settle(arena)
    refused_untouched(arena, lambda: install_preloaded(arena, preloaded), 7,
                      "not a readable package tarball")


def test_a_tarball_is_unpacked_once(arena: Arena, tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The offline attempt and the full resolution ask the preloaded source twice; the
    second ask gets the first answer, without unpacking again."""
    from installer.packages.cache import Cache
    from installer.packages.repository import Candidate
    from installer.stages.fetch import sources

    preloaded = _tarball(arena, [*_members(arena), _file("lib64/extra.so", b"x")])
    calls: list[Path] = []
    real: Callable[..., Path] = sources.unpack_tarball

    def counting(tar: Path, dest: Path) -> Path:
        calls.append(tar)
        return real(tar, dest)

    monkeypatch.setattr(sources, "unpack_tarball", counting)
    cache = Cache(tmp_path / "cache")
    source = sources.PreloadedSource(preloaded, cache, VERSION)
    kernel, version, flavour = _package(arena).relative_to(arena.scene.repo).parts
    candidate = Candidate(version, kernel, "", flavour, f"{kernel}/{version}/{flavour}")
    with cache.run():
        for _ in range(2):
            with pytest.raises(sources.ManifestError, match="not in the manifest"):
                source.get(candidate)
    assert len(calls) == 1
