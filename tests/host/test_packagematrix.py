"""`package build` for many kernels and `--flavour both`: grouping, refusals, partial failure.

The CLI runs in a subprocess (real exit code, real stdout/stderr). The header trees are
`nvsources.fake_kbuild` stand-ins whose `make modules` really runs gcc (one of them breaks
with a real compiler error), the sources `nvsources.mini_source` trees in NVIDIA's layout,
and the .debs are packed by Debian's dpkg-deb. Every build is seconds.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from nvsources import fake_kbuild, make_deb, mini_source, proprietary_source

from installer.packages.builder.headers import group_headers
from installer.packages.manifest import parse_manifest

CLI = (sys.executable, "-m", "installer")
GOOD, BAD, OTHER = "6.1.0-57-amd64", "6.1.0-56-amd64", "6.1.0-55-amd64"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "package", "build", *args], capture_output=True, text=True,
                          timeout=300, check=False)


def _errors(done: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in done.stderr.splitlines() if line.startswith("error(")]


def _refused(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stdout == ""
    errors = _errors(done)
    assert len(errors) == 1, done.stderr[-2000:]
    return errors[0]


def _index(repo: Path) -> list[tuple[str, str]]:
    packages = json.loads((repo / "index.json").read_text())["packages"]
    return sorted((p["kernel_release"], p["flavour"]) for p in packages)


@pytest.fixture
def kernels(tmp_path: Path) -> dict[str, Path]:
    return {GOOD: fake_kbuild(tmp_path / "h57", GOOD),
            BAD: fake_kbuild(tmp_path / "h56", BAD, broken=True),
            OTHER: fake_kbuild(tmp_path / "h55", OTHER)}


@pytest.fixture
def run_tree(tmp_path: Path) -> Path:
    """An extracted .run: kernel/ (proprietary) and kernel-open/ (open)."""
    root = tmp_path / "NVIDIA-Linux-x86_64-535.261.03"
    proprietary_source(root / "kernel")
    mini_source(root / "kernel-open")
    return root


class TestGrouping:
    """Headers of several releases split by release, Debian's shared companions shared."""

    def test_debs_and_directories(self, tmp_path: Path) -> None:
        def deb(name: str) -> Path:
            return make_deb(tmp_path / name, name, "6.1.192-3", tmp_path)

        debs = {name: deb(name) for name in (
            f"linux-headers-{GOOD}", f"linux-headers-{BAD}", "linux-headers-6.1.0-57-common",
            "linux-headers-6.1.0-56-common", "linux-kbuild-6.1", "linux-kbuild-6.12",
            "linux-compiler-gcc-12-x86")}
        tree = fake_kbuild(tmp_path / "build", "6.1.0-40-cloud-amd64")
        groups = group_headers((*debs.values(), tree))
        shared = {debs["linux-kbuild-6.1"], debs["linux-compiler-gcc-12-x86"]}
        assert {k: set(v) for k, v in groups.items()} == {
            GOOD: {debs[f"linux-headers-{GOOD}"], debs["linux-headers-6.1.0-57-common"],
                   *shared},
            BAD: {debs[f"linux-headers-{BAD}"], debs["linux-headers-6.1.0-56-common"],
                  *shared},
            "6.1.0-40-cloud-amd64": {tree, *shared}}

    def test_ubuntus_common_headers_go_with_their_flavours(self, tmp_path: Path) -> None:
        """Ubuntu names the common tree linux-headers-<ver>-<abi> (flavour-control.stub):
        a companion of each <ver>-<abi>-<flavour>, not a release of its own."""
        debs = {name: make_deb(tmp_path / name, name, "5.15.0-91.101", tmp_path)
                for name in ("linux-headers-5.15.0-91-generic", "linux-headers-5.15.0-91",
                             "linux-headers-5.15.0-91-lowlatency", "linux-headers-5.15.0-92",
                             "linux-headers-5.15.0-92-generic")}
        groups = group_headers(tuple(debs.values()))
        assert {k: {p.name.split("_")[0] for p in v} for k, v in groups.items()} == {
            "5.15.0-91-generic": {"linux-headers-5.15.0-91-generic", "linux-headers-5.15.0-91"},
            "5.15.0-91-lowlatency": {"linux-headers-5.15.0-91-lowlatency",
                                     "linux-headers-5.15.0-91"},
            "5.15.0-92-generic": {"linux-headers-5.15.0-92-generic", "linux-headers-5.15.0-92"}}

    def test_one_release_is_one_group(self, kernels: dict[str, Path]) -> None:
        assert group_headers((kernels[GOOD],)) == {GOOD: (kernels[GOOD],)}


class TestHeadersDebs:
    """A headers .deb is unpacked whichever compression dpkg-deb gave it (Ubuntu: zstd)."""

    @pytest.mark.parametrize("compression", ["zstd", "xz", "gzip", "none"])
    def test_a_headers_deb_of_each_compression_builds(self, tmp_path: Path,
                                                      compression: str) -> None:
        root = tmp_path / "debroot"
        fake_kbuild(root / "usr" / "src" / f"linux-headers-{GOOD}", GOOD)
        (root / "lib" / "modules" / GOOD).mkdir(parents=True)  # as Debian's package has it:
        (root / "lib" / "modules" / GOOD / "build").symlink_to(  # left out, never followed
            f"/usr/src/linux-headers-{GOOD}")
        deb = make_deb(root, f"linux-headers-{GOOD}", "6.1.192-3", tmp_path,
                       compression=compression)
        out = tmp_path / "out"
        done = _cli(f"--nvidia-source={proprietary_source(tmp_path / 'kernel')}",
                    f"--kernel-headers={deb}", f"--out-dir={out}")
        assert done.returncode == 0, done.stderr[-2000:]
        manifest = parse_manifest((out / "manifest.json").read_bytes())
        assert manifest.kernel_release == GOOD
        assert [m.name for m in manifest.modules] == [
            "nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm"]


class TestRefusals:
    """Whole-command refusals: one line with a remedy, nothing compiled or published."""

    def test_out_dir_with_several_kernels(self, tmp_path: Path, kernels: dict[str, Path],
                                          run_tree: Path) -> None:
        out = tmp_path / "out"
        line = _refused(_cli(f"--nvidia-source={run_tree / 'kernel'}",
                             f"--kernel-headers={kernels[GOOD]}",
                             f"--kernel-headers={kernels[OTHER]}", f"--out-dir={out}"))
        assert "--out-dir holds one package but this builds 2 packages" in line
        assert GOOD in line and OTHER in line and line.endswith("fix: write them into a "
                                                                "repository: --repo DIR")
        assert not out.exists()

    def test_both_flavours_need_a_repository_too(self, tmp_path: Path, kernels: dict[str, Path],
                                                  run_tree: Path) -> None:
        line = _refused(_cli(f"--nvidia-source={run_tree}", f"--kernel-headers={kernels[GOOD]}",
                             "--flavour=both", f"--out-dir={tmp_path / 'out'}"))
        assert "--out-dir holds one package" in line and "--repo" in line

    def test_sources_of_mixed_versions(self, tmp_path: Path, kernels: dict[str, Path]) -> None:
        repo = tmp_path / "repo"
        prop = proprietary_source(tmp_path / "prop" / "kernel", "550.163.01")
        opn = mini_source(tmp_path / "open" / "kernel-open", "550.144.03")
        line = _refused(_cli(f"--nvidia-source={prop}", f"--nvidia-source={opn}",
                             f"--kernel-headers={kernels[GOOD]}", "--flavour=both",
                             f"--repo={repo}"))
        assert "different driver versions" in line
        assert "kernel is 550.163.01" in line and "kernel-open is 550.144.03" in line
        assert not repo.exists()

    def test_both_without_open_sources(self, tmp_path: Path, kernels: dict[str, Path]) -> None:
        repo = tmp_path / "repo"
        prop = proprietary_source(tmp_path / "kernel")
        line = _refused(_cli(f"--nvidia-source={prop}", f"--kernel-headers={kernels[GOOD]}",
                             "--flavour=both", f"--repo={repo}"))
        assert "--flavour both needs open module sources" in line
        assert "have only proprietary modules" in line and "nvidia-open-kernel-source" in line
        assert not repo.exists()

    def test_patch_for_no_tree(self, tmp_path: Path, kernels: dict[str, Path],
                               run_tree: Path) -> None:
        patch = tmp_path / "fix.patch"
        patch.write_text("--- a/nvidia/nv-pci.c\n+++ b/nvidia/nv-pci.c\n@@ -1 +1 @@\n-a\n+b\n")
        line = _refused(_cli(f"--nvidia-source={run_tree}", f"--kernel-headers={kernels[GOOD]}",
                             "--flavour=both", f"--patch={patch}", f"--repo={tmp_path / 'r'}"))
        assert "patch fix.patch applies to none of the open or proprietary module" in line


class TestPartialFailure:
    """A kernel that does not compile is reported; the others are built and published."""

    def test_good_kernels_published_bad_one_named(self, tmp_path: Path,
                                                  kernels: dict[str, Path]) -> None:
        repo = tmp_path / "repo"
        source = proprietary_source(tmp_path / "kernel")
        done = _cli(f"--nvidia-source={source}", *(f"--kernel-headers={h}"
                                                   for h in kernels.values()),
                    "--jobs=2", f"--repo={repo}")
        assert done.returncode == 2, done.stderr[-2000:]
        assert _index(repo) == [(OTHER, "proprietary"), (GOOD, "proprietary")]
        errors = _errors(done)
        assert len(errors) == 1
        assert f"1 of 3 builds failed: {BAD} proprietary: compile failed in modinfo.c" in (
            errors[0])
        assert "'undeclared_thing' undeclared" in errors[0]
        failed = [line for line in done.stdout.splitlines() if line.startswith("FAILED")]
        assert len(failed) == 1 and failed[0].startswith(f"FAILED {BAD} proprietary: ")
        assert done.stdout.startswith("built 2 of 3 packages in ")
        assert "(2 at a time, sharing 2 make jobs)" in done.stdout.splitlines()[0]
        assert not (repo / BAD).exists()
        for release in (GOOD, OTHER):
            manifest = parse_manifest(
                (repo / release / "535.261.03" / "proprietary" / "manifest.json").read_bytes())
            assert manifest.kernel_release == release

    def test_json_lists_packages_and_failures(self, tmp_path: Path,
                                              kernels: dict[str, Path], run_tree: Path) -> None:
        repo = tmp_path / "repo"
        done = _cli(f"--nvidia-source={run_tree}", f"--kernel-headers={kernels[GOOD]}",
                    f"--kernel-headers={kernels[BAD]}", "--flavour=both", "--jobs=3",
                    f"--repo={repo}", "--output=json")
        assert done.returncode == 2, done.stderr[-2000:]
        result = json.loads(done.stdout)
        built = sorted((p["manifest"]["kernel_release"], p["manifest"]["flavour"])
                       for p in result["packages"])
        assert built == [(GOOD, "open"), (GOOD, "proprietary")] == _index(repo)
        assert sorted((f["kernel_release"], f["flavour"]) for f in result["failures"]) == [
            (BAD, "open"), (BAD, "proprietary")]
        assert all("undeclared_thing" in f["error"] for f in result["failures"])
        assert (result["concurrent_builds"], result["jobs"]) == (3, 3)


class TestBothFlavours:
    """`--flavour both` from Debian's split sources: each flavour from its own package."""

    def test_split_sources_build_both(self, tmp_path: Path, kernels: dict[str, Path]) -> None:
        repo = tmp_path / "repo"
        prop = proprietary_source(tmp_path / "debian" / "nvidia-kernel")
        opn = mini_source(tmp_path / "debian" / "nvidia-open-kernel")
        done = _cli(f"--nvidia-source={prop}", f"--nvidia-source={opn}",
                    f"--kernel-headers={kernels[GOOD]}", "--flavour=both", f"--repo={repo}")
        assert done.returncode == 0, done.stderr[-2000:]
        assert _index(repo) == [(GOOD, "open"), (GOOD, "proprietary")]
        for flavour, name in (("open", opn.name), ("proprietary", prop.name)):
            manifest = parse_manifest(
                (repo / GOOD / "535.261.03" / flavour / "manifest.json").read_bytes())
            assert manifest.flavour == flavour
            assert manifest.provenance is not None
            assert manifest.provenance["nvidia_source"]["name"] == name
        assert done.stdout.startswith("built 2 of 2 packages")


def _most_at_once(logs: list[Path]) -> int:
    """The most compile jobs that ran at the same moment, from the stand-ins' jobs.log."""
    events = sorted((float(stamp), 1 if kind == "start" else -1)
                    for log in logs for kind, stamp in (line.split()
                                                        for line in log.read_text().splitlines()))
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak


class TestJobs:
    """--jobs bounds the compile jobs of all builds together, and they use all of it."""

    @pytest.mark.parametrize("jobs", [1, 2, 3])
    def test_three_kernels_share_the_jobs(self, tmp_path: Path, jobs: int) -> None:
        trees = [fake_kbuild(tmp_path / f"h{n}", f"6.1.0-{n}-amd64", sleep=0.4)
                 for n in (50, 51, 52)]
        source = proprietary_source(tmp_path / "kernel")
        done = _cli(f"--nvidia-source={source}", *(f"--kernel-headers={t}" for t in trees),
                    f"--jobs={jobs}", f"--repo={tmp_path / 'repo'}")
        assert done.returncode == 0, done.stderr[-2000:]
        assert len(_index(tmp_path / "repo")) == 3
        assert _most_at_once([t / "jobs.log" for t in trees]) == jobs
        if jobs == 2:  # 2 builds at once, then the third alone gets the freed job too
            assert max(_most_at_once([t / "jobs.log"]) for t in trees) == 2

    def test_one_kernel_uses_its_jobs(self, tmp_path: Path) -> None:
        tree = fake_kbuild(tmp_path / "h", GOOD, sleep=0.4)
        done = _cli(f"--nvidia-source={proprietary_source(tmp_path / 'kernel')}",
                    f"--kernel-headers={tree}", "--jobs=3", f"--out-dir={tmp_path / 'out'}")
        assert done.returncode == 0, done.stderr[-2000:]
        assert _most_at_once([tree / "jobs.log"]) == 3


def test_patch_goes_only_to_the_tree_it_applies_to(tmp_path: Path, kernels: dict[str, Path],
                                                   run_tree: Path) -> None:
    """Like 550's pci_resize_resource fix: the open tree has the line, the other does not."""
    with (run_tree / "kernel-open" / "nvidia.c").open("a") as handle:
        handle.write('MODULE_INFO(gni_fix, "no");\n')
    patch = tmp_path / "open-only.patch"
    text = (run_tree / "kernel-open" / "nvidia.c").read_text().splitlines()
    patch.write_text(f"--- a/nvidia.c\n+++ b/nvidia.c\n@@ -{len(text)} +{len(text)} @@\n"
                     '-MODULE_INFO(gni_fix, "no");\n+MODULE_INFO(gni_fix, "yes");\n')
    repo = tmp_path / "repo"
    done = _cli(f"--nvidia-source={run_tree}", f"--kernel-headers={kernels[GOOD]}",
                "--flavour=both", f"--patch={patch}", f"--repo={repo}")
    assert done.returncode == 0, done.stderr[-2000:]
    patches = {}
    for flavour in ("open", "proprietary"):
        manifest = parse_manifest(
            (repo / GOOD / "535.261.03" / flavour / "manifest.json").read_bytes())
        assert manifest.provenance is not None
        patches[flavour] = [p["name"] for p in manifest.provenance["patches"]]
    assert patches == {"open": ["open-only.patch"], "proprietary": []}
