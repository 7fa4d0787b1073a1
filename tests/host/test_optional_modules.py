"""GDRCopy's gdrdrv and GPUDirect Storage's nvidia-fs as package parts: built, listed, loaded.

Build: `package build --gdrcopy --nvidia-fs` compiles the stated gdrdrv- and nvidia-fs-shaped
fixtures (tests/gdrsources.py: GDRCopy and gds-nvidia-fs are in neither Debian's nor PyPI's
archives; the nvidia-fs one's `configure` probes the headers as the real one does) with the
stand-in NVIDIA sources against the tier's real Debian headers, signs them with the others,
and lists them under `optional_modules`. Load: on a simulated node (FakeKernelHost) gdrdrv
goes in after nvidia and /dev/gdrdrv gets the major /proc/devices gives "gdrdrv", minor 0;
nvidia-fs gets /dev/nvidia-fs0..15; a gdrdrv that fails leaves the driver loaded, and
`install` (real CLI) exits 0 with the GPUs ready and `gpu-node-installer/GDRCopyReady`
saying why.
"""

from __future__ import annotations

import errno
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e import KERNEL, add_version, make_scene, run_cli, standin_env
from fallbacknode import headers_debs
from gdrsources import GDR_VERSION, NVFS_VERSION, gdrcopy_fixture, nvfs_fixture
from httpserver import MirrorServer, answering_api
from native import build_standins
from native.packages import standin_tree
from nvsources import fake_headers, mini_source
from signing_keys import make_key, modinfo

from installer import errors
from installer.node import kmod
from installer.node.host import Roots
from installer.packages.builder import BuildRequest, build
from installer.packages.builder.modsig import strip_signature
from installer.packages.manifest import ManifestError, Package, dump_manifest, parse_manifest
from installer.packages.tree import read_tree
from installer.stages import load
from installer.testing import SAMPLE_NODES, build_node
from installer.testing.kernel import (
    FakeKernelHost,
    fake_module_set,
    module_file_bytes,
    write_package,
)

V1 = "535.261.03"
CLI = (sys.executable, "-m", "installer")
RELEASE = "6.1.0-57-amd64"


# --------------------------------------------------------------------------- build


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, object]]:
    """One real build: stand-in NVIDIA sources + the gdrdrv fixture, real headers, signed."""
    debs = headers_debs()
    if debs is None:
        pytest.skip("needs dpkg-deb and gcc-12 (the kernel's compiler): make deps")
    work = tmp_path_factory.mktemp("gdrbuild")
    keys = make_key(work / "keys")
    tree = standin_tree(work / "tree", build_standins(work / "built"), V1)
    out = work / "out"
    done = subprocess.run([*CLI, "package", "build", f"--nvidia-source={mini_source(work / 'nv')}",
                           *(f"--kernel-headers={d}" for d in debs), f"--tree={tree}",
                           f"--gdrcopy={gdrcopy_fixture(work / 'gdrcopy')}",
                           f"--nvidia-fs={nvfs_fixture(work / 'nvfs', compiles=True)}",
                           f"--sign-key={keys.key}", f"--sign-cert={keys.cert}",
                           f"--out-dir={out}", "--output=json"],
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return out, json.loads((out / "manifest.json").read_text())


def test_gdrdrv_is_an_optional_module_of_the_package(built: tuple[Path, dict[str, object]]
                                                     ) -> None:
    out, manifest = built
    assert manifest["optional_modules"] == [
        {"name": "gdrdrv", "file": "modules/gdrdrv.ko", "depends": ["nvidia"], "params": {}},
        {"name": "nvidia_fs", "file": "modules/nvidia-fs.ko", "depends": ["nvidia"],
         "params": {}}]
    modules = manifest["modules"]
    assert isinstance(modules, list)
    assert not {"gdrdrv", "nvidia_fs"} & {m["name"] for m in modules}
    provenance = manifest["provenance"]
    assert isinstance(provenance, dict)
    assert [(s["name"], s["version"]) for s in provenance["optional_sources"]] == [
        ("gdrcopy", GDR_VERSION), ("nvfs", NVFS_VERSION)]
    for ko, name in (("gdrdrv.ko", "gdrdrv"), ("nvidia-fs.ko", "nvidia_fs")):
        info = modinfo(out / "modules" / ko)
        assert info["name"] == name and info["depends"] == "nvidia"
        assert info["vermagic"].startswith(f"{RELEASE} ")  # NVIDIA's modules' headers
    # nvidia-fs's configure probed the given headers (its fixture #errors otherwise), and
    # its GDS_VERSION reached the compiler as the Makefile passes it
    assert modinfo(out / "modules" / "nvidia-fs.ko")["version"] == NVFS_VERSION


def test_the_same_inputs_give_the_same_optional_modules(
        built: tuple[Path, dict[str, object]], tmp_path: Path) -> None:
    """Another build in another directory: byte-identical gdrdrv and nvidia-fs (the
    signatures aside: this one is not signed)."""
    debs = headers_debs()
    assert debs is not None
    tree = tmp_path / "deeper" / "path"
    result = build(BuildRequest(nvidia_source=mini_source(tree / "nv"),
                                kernel_headers=tuple(debs),
                                gdrcopy=gdrcopy_fixture(tree / "gdrcopy"),
                                nvidia_fs=nvfs_fixture(tree / "nvfs", compiles=True),
                                output=tmp_path / "again"))
    for ko in ("gdrdrv.ko", "nvidia-fs.ko"):
        first = strip_signature((built[0] / "modules" / ko).read_bytes())[0]
        assert (result.directory / "modules" / ko).read_bytes() == first, ko


def test_gdrdrv_is_signed_like_the_others(built: tuple[Path, dict[str, object]]) -> None:
    out, manifest = built
    signatures = manifest["signatures"]
    assert isinstance(signatures, list)
    signed = {s["file"] for s in signatures}
    assert {"modules/gdrdrv.ko", "modules/nvidia-fs.ko", "modules/nvidia.ko"} <= signed
    assert kmod.is_signed((out / "modules" / "gdrdrv.ko").read_bytes())


def test_the_manifest_passes_the_published_schema(built: tuple[Path, dict[str, object]]
                                                  ) -> None:
    import jsonschema

    schema = json.loads((Path(__file__).parents[2] / "docs/manifest.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(built[1])


def test_a_module_in_both_lists_is_refused(built: tuple[Path, dict[str, object]]) -> None:
    """A gdrdrv listed as the driver's and as optional: exit 7's manifest error."""
    manifest = dict(built[1])
    optional = manifest["optional_modules"]
    assert isinstance(optional, list)
    manifest["modules"] = [*manifest["modules"], optional[0]]  # type: ignore[misc]
    with pytest.raises(ManifestError, match=r"optional_modules\[0\]: 'gdrdrv' is also in "
                                            "modules"):
        parse_manifest(json.dumps(manifest).encode())


def test_a_gdrdrv_that_does_not_compile_is_one_line(tmp_path: Path) -> None:
    debs = headers_debs()
    if debs is None:
        pytest.skip("needs dpkg-deb and gcc-12 (the kernel's compiler): make deps")
    line = _refused(tmp_path, f"--nvidia-source={mini_source(tmp_path / 'nv')}",
                    *(f"--kernel-headers={d}" for d in debs),
                    f"--gdrcopy={gdrcopy_fixture(tmp_path / 'g', broken=True)}")
    assert f"--gdrcopy: GDRCopy did not compile for {RELEASE}: gdrdrv.c:" in line, line
    assert "nope" in line and "undeclared" in line


def test_a_manifest_without_optional_modules_keeps_its_bytes(
        built: tuple[Path, dict[str, object]]) -> None:
    _out, manifest = built
    old = dict(manifest)
    del old["optional_modules"]
    old["modules"] = list(manifest["modules"])  # type: ignore[call-overload]
    data = (json.dumps(old, indent=1) + "\n").encode()
    assert dump_manifest(parse_manifest(data)) == data
    assert "optional_modules" not in data.decode()


# --------------------------------------------------------------------------- refusals


def _refused(tmp_path: Path, *args: str) -> str:
    """Exit 2 and one error line (a compile also logs its progress as JSON events)."""
    out = tmp_path / "out"
    done = subprocess.run([*CLI, "package", "build", *args, f"--out-dir={out}"],
                          capture_output=True, text=True, timeout=300, check=False)
    lines = [line for line in done.stderr.strip().splitlines() if not line.startswith("{")]
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and lines[0].startswith("error(config): "), lines
    assert not out.exists() or not any(out.iterdir())
    return lines[0]


def test_nvidia_fs_with_the_proprietary_flavour_is_refused(tmp_path: Path) -> None:
    headers = fake_headers(tmp_path / f"linux-headers-{RELEASE}", RELEASE)
    line = _refused(tmp_path, f"--nvidia-source={mini_source(tmp_path / 'nv')}",
                    f"--kernel-headers={headers}", "--flavour=proprietary",
                    f"--nvidia-fs={nvfs_fixture(tmp_path / 'nvfs')}")
    assert "--nvidia-fs needs NVIDIA's open kernel modules" in line
    assert "fix: build with --flavour open" in line


def test_a_source_that_is_not_gdrcopy_is_refused_before_compiling(tmp_path: Path) -> None:
    headers = fake_headers(tmp_path / f"linux-headers-{RELEASE}", RELEASE)
    line = _refused(tmp_path, f"--nvidia-source={mini_source(tmp_path / 'nv')}",
                    f"--kernel-headers={headers}",
                    f"--gdrcopy={nvfs_fixture(tmp_path / 'other')}")
    assert "is not GDRCopy's source tree (no src/gdrdrv/gdrdrv.c and " \
           "src/gdrdrv/Makefile)" in line


def test_gdrcopy_needs_headers_to_compile_against(tmp_path: Path) -> None:
    line = _refused(tmp_path, f"--nvidia-source={mini_source(tmp_path / 'nv')}",
                    f"--tree={tmp_path}", f"--gdrcopy={gdrcopy_fixture(tmp_path / 'g')}")
    assert "--gdrcopy needs --nvidia-source with --kernel-headers" in line


# --------------------------------------------------------------------------- load


def _node(tmp_path: Path) -> FakeKernelHost:
    root = build_node(tmp_path / "node", SAMPLE_NODES["gke-ubuntu-t4"])
    return FakeKernelHost(Roots(root, root / "proc", root / "sys", root / "dev"))


def _package(tmp_path: Path, optional: dict[str, tuple[str, ...]], version: str = V1
             ) -> Package:
    """The fake driver plus fake optional modules (name -> depends), listed as optional."""
    tmp_path = tmp_path / version
    modules = fake_module_set(tmp_path / "ko", version, kernel_release=KERNEL)
    extra = {f"kernel/{name}.ko": (module_file_bytes(name, "2.6", depends,
                                                     kernel_release=KERNEL), "module")
             for name, depends in optional.items()}
    root = tmp_path / "pkg"
    write_package(root, modules, driver_version=version, kernel_release=KERNEL,
                  extra_files=extra)
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["optional_modules"] = [{"name": name, "file": f"kernel/{name}.ko",
                                     "depends": ["nvidia"], "params": {}}
                                    for name in optional]
    (root / "manifest.json").write_text(json.dumps(manifest))
    return read_tree(root)


def test_gdrdrv_goes_in_after_nvidia_and_gets_its_node(tmp_path: Path) -> None:
    host = _node(tmp_path)
    result = load.load_package(host, _package(tmp_path, {"gdrdrv": ("nvidia",)}))
    loads = [name for kind, name in host.calls if kind == "load"]
    assert loads.index("gdrdrv.ko") > loads.index("nvidia.ko")
    (verdict,) = result.optional
    assert (verdict.ready, verdict.reason, verdict.nodes) == (True, "Loaded", ("/dev/gdrdrv",))
    assert verdict.message == "gdrdrv 2.6 loaded after nvidia; /dev/gdrdrv made"
    again = load.load_package(host, _package(tmp_path, {"gdrdrv": ("nvidia",)}))
    assert again.optional[0].message == "gdrdrv 2.6 already loaded after nvidia; /dev/gdrdrv"
    assert not again.changed
    major = kmod.char_majors(host)["gdrdrv"]
    assert host.nodes[host.roots.dev / "gdrdrv"] == (major, 0, 0o666)
    assert "gdrdrv" in result.loaded


def test_a_version_change_takes_our_gdrdrv_out_first_and_back_in(tmp_path: Path) -> None:
    """The package ships gdrdrv, so the loaded one (holding nvidia) is ours to replace; a
    gdrdrv the package does not ship still blocks (test_load's foreign holder)."""
    host = _node(tmp_path)
    load.load_package(host, _package(tmp_path, {"gdrdrv": ("nvidia",)}))
    result = load.load_package(host, _package(tmp_path, {"gdrdrv": ("nvidia",)}, "550.54.14"))
    assert result.unloaded.index("gdrdrv") < result.unloaded.index("nvidia")
    assert result.optional[0].ready and "gdrdrv" in result.loaded
    state = kmod.module_state(host, "nvidia")
    assert state is not None and state.version == "550.54.14"


def test_unload_takes_gdrdrv_out_before_nvidia_unless_it_is_open(tmp_path: Path) -> None:
    host = _node(tmp_path)
    load.load_package(host, _package(tmp_path, {"gdrdrv": ("nvidia",)}))
    pid = host.open_device("gdrdrv", "/dev/gdrdrv")
    with pytest.raises(errors.ModuleInUseError, match="in use: gdrdrv"):
        load.unload(host)
    assert kmod.module_state(host, "nvidia") is not None
    host.close_device(pid, "gdrdrv")
    done = load.unload(host)
    assert done.unloaded.index("gdrdrv") < done.unloaded.index("nvidia")


def test_a_directory_where_its_node_goes_fails_only_gdrdrv(tmp_path: Path) -> None:
    host = _node(tmp_path)
    (host.roots.dev / "gdrdrv").mkdir(parents=True)
    (host.roots.dev / "gdrdrv" / "keep").write_text("someone's\n")
    result = load.load_package(host, _package(tmp_path, {"gdrdrv": ("nvidia",)}))
    (verdict,) = result.optional
    assert (verdict.ready, verdict.reason) == (False, "DeviceNodeFailed"), verdict
    assert verdict.message.startswith("gdrdrv is loaded but its device node could not be "
                                      "made: ")
    assert (host.roots.dev / "gdrdrv" / "keep").read_text() == "someone's\n"
    assert kmod.module_state(host, "nvidia") is not None and host.nodes


def test_nvidia_fs_gets_sixteen_nodes(tmp_path: Path) -> None:
    host = _node(tmp_path)
    result = load.load_package(host, _package(tmp_path, {"nvidia_fs": ("nvidia",)}))
    (verdict,) = result.optional
    assert verdict.ready, verdict.message
    major = kmod.char_majors(host)["nvidia-fs"]
    assert [host.nodes[host.roots.dev / f"nvidia-fs{i}"] for i in range(16)] == [
        (major, i, 0o666) for i in range(16)]
    assert not (host.roots.dev / "nvidia-fs16").exists()


def test_a_failing_gdrdrv_leaves_the_driver_loaded(tmp_path: Path) -> None:
    host = _node(tmp_path)
    host.fail_next["gdrdrv"] = errno.EINVAL
    result = load.load_package(host, _package(tmp_path, {"gdrdrv": ("nvidia",)}))
    (verdict,) = result.optional
    assert (verdict.ready, verdict.reason) == (False, "LoadFailed")
    assert verdict.message.startswith("gdrdrv not loaded: loading gdrdrv")
    assert kmod.module_state(host, "nvidia") is not None
    assert "nvidia" in result.loaded and "gdrdrv" not in result.loaded
    assert not (host.roots.dev / "gdrdrv").exists()
    assert verdict.message in result.warnings


# --------------------------------------------------------------------------- install


@pytest.fixture
def api() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    with answering_api() as served:
        yield served


def test_install_with_a_broken_gdrdrv_is_ready_and_says_why(
        tmp_path: Path, api: tuple[str, list[dict[str, Any]]]) -> None:
    """gdrdrv needs a module the node does not have: GPUs ready (exit 0), the condition
    GDRCopyReady False with the cause, `status` says it."""
    scene = make_scene(tmp_path)
    broken = module_file_bytes("gdrdrv", "2.6", ["nvidia", "nv_missing"],
                               kernel_release=KERNEL)
    add_version(scene, V1, extra_modules={"gdrdrv.ko": broken})
    account = tmp_path / "sa"
    account.mkdir()
    (account / "token").write_text("token")
    with MirrorServer(scene.repo) as server:
        done = run_cli(["install", *scene.args(
            "--mirror", server.url, "--driver-version", V1, "--allow-http",
            "--node-name", "gpu-node-1", "--kube-api", api[0],
            "--service-account-dir", str(account))], standin_env(V1))
    assert done.returncode == 0, done.stderr[-2000:]
    assert (scene.root / "proc/modules").read_text().startswith(("nvidia", "nvidia_uvm"))
    conditions = [c for call in api[1] if call["path"] == "/api/v1/nodes/gpu-node-1/status"
                  for c in call["body"]["status"]["conditions"]]
    (condition,) = [c for c in conditions if c["type"] == "gpu-node-installer/GDRCopyReady"]
    assert (condition["status"], condition["reason"]) == ("False", "LoadFailed")
    assert "nv_missing" in condition["message"]
    ready = json.loads((scene.install_dir / ".ready.json").read_text())
    (entry,) = ready["optional_modules"]
    assert (entry["module"], entry["ready"], entry["reason"]) == ("gdrdrv", False,
                                                                  "LoadFailed")
    assert "nv_missing" in entry["message"]
    assert not (scene.root / "dev/gdrdrv").exists()
    status = run_cli(["status", *scene.args()], standin_env(V1))
    assert "Optional:        gdrdrv not loaded (LoadFailed: gdrdrv not loaded: " \
           in status.stdout, status.stdout


def test_install_loads_gdrdrv_and_makes_its_node(tmp_path: Path) -> None:
    scene = make_scene(tmp_path)
    gdrdrv = module_file_bytes("gdrdrv", "2.6", ["nvidia"], kernel_release=KERNEL)
    add_version(scene, V1, extra_modules={"gdrdrv.ko": gdrdrv})
    with MirrorServer(scene.repo) as server:
        done = run_cli(["install", *scene.args("--mirror", server.url, "--driver-version",
                                               V1, "--allow-http")], standin_env(V1))
    assert done.returncode == 0, done.stderr[-2000:]
    devices = (scene.root / "proc/devices").read_text()
    major = next(int(line.split()[0]) for line in devices.splitlines()
                 if line.split()[1:] == ["gdrdrv"])
    assert (scene.root / "dev/gdrdrv").read_text() == f"char {major}:0\n"
    status = run_cli(["status", *scene.args("--output", "json")], standin_env(V1))
    report = json.loads(status.stdout)["optional"]["gdrdrv"]
    assert (report["loaded"], report["reason"], report["condition"]) == (
        True, "Loaded", "GDRCopyReady")
