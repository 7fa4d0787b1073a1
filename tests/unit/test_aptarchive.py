"""The apt client's choices: dpkg's version order (not the listing's), dependency relations,
and which dependencies a headers package's closure follows (Debian's and Ubuntu's names).

The Ubuntu names follow Ubuntu's kernel packaging: the flavour package
`linux-headers-PKGVER-ABINUM-FLAVOUR` depends on `SRCPKGNAME-headers-PKGVER-ABINUM`
(debian.master/control.d/flavour-control.stub in torvalds/linux as mirrored with Ubuntu's
packaging, @ 6d076cb958f562cdf07727a58b6545c96ccfcfcc), SRCPKGNAME being `linux` for
Ubuntu's own kernel and `linux-gcp`, `linux-aws`, ... for the derivatives.
"""

from __future__ import annotations

import re

import pytest

from installer.packages.builder import aptheaders
from installer.packages.builder.aptarchive import Stanza, _parse, choose, satisfies
from installer.packages.builder.inputs import PackageBuildError


def _stanza(name: str, version: str, *depends: tuple[str, tuple[str, str] | None]) -> Stanza:
    return Stanza(name, version, f"pool/{name}_{version}.deb", 1, "0" * 64, depends)


def test_the_highest_version_wins_wherever_it_is_listed() -> None:
    index = {"nvidia-kernel-source": [_stanza("nvidia-kernel-source", v) for v in (
        "535.261.03-1", "550.163.01-2", "535.309.01-0+deb12u1", "550.54.14-1~bpo12+1")]}
    assert choose("nvidia-kernel-source", index, None).version == "550.163.01-2"
    index = {"h": [_stanza("h", v) for v in ("6.1.0-57.10", "6.1.0-57.9", "1:0.1",
                                             "6.1.0-57.10~rc")]}
    assert choose("h", index, None).version == "1:0.1"  # an epoch outranks everything


def test_relations_are_dpkgs() -> None:
    assert satisfies("6.1.192-3", (">=", "6.1.192-3"))
    assert satisfies("6.1.192-10", (">>", "6.1.192-9"))
    assert not satisfies("6.1.192-3~bpo", (">=", "6.1.192-3"))
    assert satisfies("6.1.192-3", ("=", "6.1.192-3"))
    assert not satisfies("6.1.192-3", ("<<", "6.1.192-3"))
    assert not satisfies("6.1.192-3", ("~=", "6.1.192-3"))  # not an operator: never met


def test_a_missing_version_names_those_there_are() -> None:
    index = {"p": [_stanza("p", "1.10-1"), _stanza("p", "1.9-1")]}
    with pytest.raises(PackageBuildError, match=r"no p 2\.0-1 \(it has 1\.9-1, 1\.10-1\)"):
        choose("p", index, ("=", "2.0-1"))


@pytest.mark.parametrize(("flavour", "common"), [
    ("linux-headers-5.15.0-91-generic", "linux-headers-5.15.0-91"),
    ("linux-headers-5.15.0-1049-gcp", "linux-gcp-headers-5.15.0-1049"),
    ("linux-headers-6.5.0-1016-aws", "linux-aws-headers-6.5.0-1016"),
    ("linux-headers-5.15.0-1057-azure", "linux-azure-headers-5.15.0-1057"),
    ("linux-headers-6.8.0-1008-nvidia", "linux-nvidia-headers-6.8.0-1008"),
    ("linux-headers-5.15.0-91-generic", "linux-hwe-5.15-headers-5.15.0-91"),
])
def test_ubuntus_flavours_bring_their_common_headers(flavour: str, common: str) -> None:
    """Unversioned, as the stub writes it: the flavour's own upload is taken, not a newer
    one of the common package; libc6 and the like are not followed."""
    version = "5.15.0-91.101"
    index = {flavour: [_stanza(flavour, version, (common, None), ("libc6", (">=", "2.34")))],
             common: [_stanza(common, version), _stanza(common, "5.15.0-91.102")],
             "libc6": [_stanza("libc6", "2.35-0ubuntu3")]}
    closure = aptheaders._closure(flavour, index)
    assert [(s.name, s.version) for s in closure] == sorted(
        [(flavour, version), (common, version)])


def test_debians_kbuild_dependency_is_a_lower_bound() -> None:
    """bookworm's headers say `linux-kbuild-6.1 (>= 6.1.192-3)`: the same upload is taken
    where there, a lower one never; gcc is not followed."""
    name, common, kbuild = ("linux-headers-6.1.0-57-amd64", "linux-headers-6.1.0-57-common",
                            "linux-kbuild-6.1")
    index = {name: [_stanza(name, "6.1.192-3", (common, ("=", "6.1.192-3")),
                            (kbuild, (">=", "6.1.192-3")), ("linux-compiler-gcc-12-x86", None))],
             common: [_stanza(common, "6.1.192-3")],
             kbuild: [_stanza(kbuild, "6.1.170-3"), _stanza(kbuild, "6.1.192-3"),
                      _stanza(kbuild, "6.1.200-1")]}
    assert {(s.name, s.version) for s in aptheaders._closure(name, index)} == {
        (name, "6.1.192-3"), (common, "6.1.192-3"), (kbuild, "6.1.192-3")}
    index[kbuild] = [_stanza(kbuild, "6.1.170-3"), _stanza(kbuild, "6.1.200-1")]
    assert {(s.name, s.version) for s in aptheaders._closure(name, index)} == {
        (name, "6.1.192-3"), (common, "6.1.192-3"), (kbuild, "6.1.200-1")}


def test_only_the_familys_paragraphs_are_parsed() -> None:
    text = ("Package: bash\nVersion: 5.2-1\nFilename: pool/b.deb\nSize: 1\nSHA256: aa\n\n"
            "Package: linux-headers-5.15.0-91-generic\nVersion: 5.15.0-91.101\n"
            "Depends: linux-headers-5.15.0-91, libc6 (>= 2.34) | libc6-udeb\n"
            "Filename: pool/h.deb\nSize: 12\nSHA256: AB\n\n"
            "Package: linux-headers-5.15.0-91\nVersion: 5.15.0-91.101\nFilename: pool/c.deb\n"
            "Size: x\nSHA256: cd\n\n"
            "Package: linux-headers-5.15.0-90\nVersion: 5.15.0-90.100\n")  # no Filename
    family = re.compile(r"linux-\S+")
    assert list(_parse(text, family)) == [
        Stanza("linux-headers-5.15.0-91-generic", "5.15.0-91.101", "pool/h.deb", 12, "ab",
               (("linux-headers-5.15.0-91", None), ("libc6", (">=", "2.34")))),
        Stanza("linux-headers-5.15.0-91", "5.15.0-91.101", "pool/c.deb", -1, "cd", ())]
