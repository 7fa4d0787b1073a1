"""UBUNTU_SOURCE, UBUNTU_APT_MIRROR, UBUNTU_KEYRING: checked before any I/O; and the pure
parts of the Ubuntu archive resolution (branch names, pockets, versions)."""

from __future__ import annotations

from pathlib import Path

import pytest

from installer.config import load_config
from installer.errors import ConfigError
from installer.packages.builder.aptarchive import Stanza
from installer.packages.builder.inputs import PackageBuildError
from installer.packages.builder.ubuntuapt import (
    Branch,
    family,
    offered,
    parse_branch,
    pockets,
    upstream,
)


def test_defaults_and_values(roots: dict[str, str]) -> None:
    config = load_config(roots, {})
    assert (config.ubuntu_source, config.ubuntu_apt_mirror, config.ubuntu_keyring) == (
        "never", None, None)
    config = load_config(roots, {"UBUNTU_SOURCE": "AUTO",
                                 "UBUNTU_APT_MIRROR": "http://mirror.internal/ubuntu/",
                                 "UBUNTU_KEYRING": "/etc/ubuntu.gpg"})
    assert (config.ubuntu_source, config.ubuntu_apt_mirror, config.ubuntu_keyring) == (
        "auto", "http://mirror.internal/ubuntu", Path("/etc/ubuntu.gpg"))


@pytest.mark.parametrize(("env", "named"), [
    ({"UBUNTU_SOURCE": "off"}, "UBUNTU_SOURCE"),
    ({"UBUNTU_APT_MIRROR": "ftp://mirror/ubuntu"}, "UBUNTU_APT_MIRROR"),
    ({"UBUNTU_APT_MIRROR": "https://u:secret@host/x\n"}, "UBUNTU_APT_MIRROR"),
    ({"UBUNTU_KEYRING": "keyring.gpg"}, "UBUNTU_KEYRING")])
def test_refused(roots: dict[str, str], env: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(roots, env)
    line = caught.value.one_line()
    assert named in line and "secret" not in line, line


@pytest.mark.parametrize(("spec", "branch"), [
    ("535", Branch("535")), ("R535", Branch("535")), ("535-server", Branch("535", True)),
    ("1000-server", Branch("1000", True))])
def test_branches(spec: str, branch: Branch) -> None:
    assert parse_branch(spec) == branch


@pytest.mark.parametrize("spec", ["535-open", "53", "535.261.03", "../535", "535-server "])
def test_not_a_branch(spec: str) -> None:
    with pytest.raises(PackageBuildError):
        parse_branch(spec)


def test_one_release_suite_means_its_pockets() -> None:
    assert pockets(["noble"]) == ("noble", "noble-updates", "noble-security")
    assert pockets(["noble-updates"]) == ("noble-updates",)
    assert pockets(["noble", "noble-proposed"]) == ("noble", "noble-proposed")


def test_upstream_versions() -> None:
    assert upstream("535.261.03-0ubuntu0.22.04.1") == "535.261.03"
    assert upstream("1:535.261.03-0ubuntu1") == "535.261.03"
    assert upstream("535.261.03") == "535.261.03"


def _stanza(name: str, version: str) -> Stanza:
    return Stanza(name, version, f"pool/{name}.deb", 1, "0" * 64, ())


def test_offered_branches_for_the_kernel_only() -> None:
    kernel = "6.8.0-44-generic"
    names = [(f"linux-modules-nvidia-535-server-open-{kernel}", "6.8.0-44.1"),
             (f"linux-modules-nvidia-570-open-{kernel}", "6.8.0-44.1"),
             ("linux-modules-nvidia-550-open-6.8.0-45-generic", "6.8.0-45.1"),
             ("libnvidia-compute-535-server", "535.261.03-0ubuntu1"),
             ("libnvidia-compute-535-server", "535.274.02-0ubuntu0.24.04.1"),
             ("libnvidia-compute-550", "550.163.01-0ubuntu1")]
    pattern = family(kernel)
    index: dict[str, list[Stanza]] = {}
    for name, version in names:
        if pattern.fullmatch(name):
            index.setdefault(name, []).append(_stanza(name, version))
    assert "linux-modules-nvidia-550-open-6.8.0-45-generic" not in index
    # 570 has modules but no user-mode packages: not offered
    assert offered(index, kernel) == {Branch("535", True): "535.274.02"}
