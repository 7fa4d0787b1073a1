"""Kernel release ordering (installer.agent.kernelorder): dpkg's verrevcmp over `uname -r`,
checked on the releases Debian, Ubuntu and COS ship and against the real dpkg."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from installer.agent.kernelorder import compare, newer, newest

# (older, newer) as each distribution released them
ORDERED = [
    ("6.1.0-57-amd64", "6.1.0-58-amd64"),  # Debian 12 point release
    ("6.1.0-9-amd64", "6.1.0-10-amd64"),  # a digit more
    ("6.1.0-58-amd64", "6.12.117+deb13-amd64"),  # Debian 12 -> 13
    ("6.12.117+deb13-amd64", "6.12.118+deb13-amd64"),
    ("6.8.0-51-generic", "6.8.0-100-generic"),  # Ubuntu 24.04
    ("5.15.0-1060-gke", "6.8.0-1015-gke"),  # Ubuntu's GKE kernels, HWE
    ("6.6.9+", "6.6.56+"),  # COS
    ("6.6.56+", "6.6.72+"),
    ("6.1~rc1", "6.1"),  # `~` sorts before the end
]


@pytest.mark.parametrize(("older", "later"), ORDERED)
def test_distribution_releases_order_as_released(older: str, later: str) -> None:
    assert compare(older, later) < 0 < compare(later, older)
    assert newer(later, older) and not newer(older, later)


@pytest.mark.parametrize("release", ["6.1.0-58-amd64", "6.6.56+", "6.8.0-51-generic"])
def test_the_same_release_is_not_newer(release: str) -> None:
    assert compare(release, release) == 0 and not newer(release, release)


def test_newest_picks_the_latest_of_many() -> None:
    found = ["6.1.0-10-amd64", "6.1.0-58-amd64", "6.1.0-9-amd64", "6.1.0-57-amd64"]
    assert newest(found) == "6.1.0-58-amd64"
    assert newest([]) is None


RELEASE = st.from_regex(r"[1-9][0-9]{0,2}(\.[0-9]{1,3}){0,2}([-+~.][a-z0-9]{1,6}){0,3}",
                        fullmatch=True)


@pytest.mark.skipif(shutil.which("dpkg") is None, reason="needs dpkg")
@settings(max_examples=60, deadline=None)
@given(RELEASE, RELEASE)
def test_the_order_is_dpkgs(a: str, b: str) -> None:
    """`dpkg --compare-versions A-0 gt B-0` compares the upstream parts A and B with
    verrevcmp (equal revisions): the very function this ordering reimplements."""
    def dpkg(op: str) -> bool:
        return subprocess.run(["dpkg", "--compare-versions", f"{a}-0", op, f"{b}-0"],
                              check=False, timeout=5).returncode == 0
    assert (compare(a, b) > 0) == dpkg("gt")
    assert (compare(a, b) == 0) == dpkg("eq")


@given(RELEASE, RELEASE)
def test_the_order_is_antisymmetric(a: str, b: str) -> None:
    assert (compare(a, b) > 0) == (compare(b, a) < 0)
