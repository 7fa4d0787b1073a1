"""The build farm against the real headers of three Debian kernels (no guest is booted).

Stand-in NVIDIA-shaped sources (both flavours, tests/buildfarm.run_tree) compiled against
bookworm's real 6.1.0-57, -56 and -55 headers .debs (the tier's cache): three
`package build --shard N/3` processes run at once into one directory, then
`package index`; the packages and the index are byte-identical to one `--repo` build of
the same 3 x 2 matrix. tests/host/test_buildfarm.py covers the rest in seconds.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from buildfarm import finish, matrix_args, package_files, run_tree, start_shard, timed

from installer.node import kmod

from . import assets

pytestmark = pytest.mark.timeout(3600)
RELEASES = ("6.1.0-57-amd64", "6.1.0-56-amd64", "6.1.0-55-amd64")


def test_three_concurrent_shards_equal_one_repo_build(tmp_path: Path) -> None:
    headers = [deb for release in RELEASES for deb in assets.release_headers_debs(release)]
    args = matrix_args(run_tree(tmp_path), headers, jobs=1)
    single = tmp_path / "single"
    timed(["package", "build", *args, f"--repo={single}", "--alias=latest"])
    shared = tmp_path / "shared"
    shards = [start_shard(args, shared, f"{n}/3") for n in range(3)]
    parts = [json.loads(finish(shard))["packages"] for shard in shards]
    assert [len(part) for part in parts] == [2, 2, 2]
    timed(["package", "index", str(shared), "--alias=latest=535.261.03"])
    assert (shared / "index.json").read_bytes() == (single / "index.json").read_bytes()
    files = package_files(shared)
    assert files == package_files(single)
    index = json.loads((shared / "index.json").read_text())["packages"]
    assert sorted((p["kernel_release"], p["flavour"]) for p in index) == sorted(
        (r, f) for r in RELEASES for f in ("open", "proprietary"))
    for entry in index:  # each package's modules really were built for its kernel
        ko = shared / entry["path"] / "modules" / "nvidia.ko"
        assert kmod.modinfo(ko.read_bytes())["vermagic"][0].split()[0] == entry["kernel_release"]
