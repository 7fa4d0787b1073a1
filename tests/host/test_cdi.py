"""The CDI spec: what a real `install` writes, validated against the CDI project's
own JSON schema (Debian's golang-github-container-orchestrated-devices-container-device-
interface-dev carries it; scripts/install-deps.sh extracts its schema/), for each node shape:
1 GPU (a real install), 8 GPUs with NVSwitch (real character devices on a host tree), and no
GPU (no spec at all: a spec with no device would name nothing to ask for). Then its life:
replaced atomically on a version switch, repointed by a rollback, removed on uninstall and
by CDI=off, moved with CDI_SPEC_DIR; a spec we did not write is never touched."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
from pathlib import Path, PurePosixPath

import jsonschema
import pytest
import referencing
import yaml
from e2e import Scene, add_version, make_scene, run_cli, standin_env
from httpserver import MirrorServer

from installer.installdir import cdi
from installer.node.host import RealHost, Roots
from installer.testing import SAMPLE_NODES, build_node

V1, V2 = "535.261.03", "535.309.01"
SCHEMA_DIR = Path(os.environ.get("GNI_CDI_SCHEMA_DIR",
                                 "/usr/local/share/gpu-node-installer-test/cdi-schema"))
SPEC = "var/run/cdi/gpu-node-installer-nvidia.json"
OPTIONS = ["ro", "nosuid", "nodev", "bind"]


def validate(spec: dict[str, object]) -> None:
    """Against schema.json with its defs.json, as the CDI project's validator loads them."""
    if not (SCHEMA_DIR / "schema.json").is_file():
        pytest.fail(f"the CDI schema is missing from {SCHEMA_DIR}: run `make deps` as root")
    schema = json.loads((SCHEMA_DIR / "schema.json").read_text())
    defs = referencing.Resource.from_contents(
        json.loads((SCHEMA_DIR / "defs.json").read_text()),
        default_specification=referencing.jsonschema.DRAFT7)
    registry: referencing.Registry[object] = referencing.Registry().with_resource(
        "defs.json", defs)
    jsonschema.Draft7Validator(schema, registry=registry).validate(spec)


def install(scene: Scene, mirror: str, version: str, *extra: str
            ) -> subprocess.CompletedProcess[str]:
    return run_cli(["install", *scene.args("--mirror", mirror, "--driver-version", version,
                                           "--allow-http", *extra)], standin_env(version))


def cli(scene: Scene, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli([*args, *scene.args()], standin_env(V1))


def version_dir(version: str) -> str:
    return f"/home/kubernetes/bin/nvidia/.versions/{version}-5.15.0-1049-gke-proprietary"


@pytest.fixture
def scene(tmp_path: Path) -> Scene:
    scene = make_scene(tmp_path)
    add_version(scene, V1)
    return scene


class TestShapes:
    def test_one_gpu_install_writes_a_valid_spec(self, scene: Scene) -> None:
        with MirrorServer(scene.repo) as server:
            done = install(scene, server.url, V1)
        assert done.returncode == 0, done.stderr
        spec = json.loads((scene.root / SPEC).read_text())
        validate(spec)
        uuid = json.loads((scene.install_dir / ".ready.json").read_text())["gpus"][0]["uuid"]
        assert spec["cdiVersion"] == "0.5.0" and spec["kind"] == "nvidia.com/gpu"
        assert [d["name"] for d in spec["devices"]] == ["0", uuid, "all"]
        gpu = {"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0,
               "permissions": "rw"}
        assert all(d["containerEdits"]["deviceNodes"] == [gpu] for d in spec["devices"])
        edits = spec["containerEdits"]
        uvm_major = next(int(line.split()[0]) for line in
                         (scene.root / "proc/devices").read_text().splitlines()
                         if line.endswith(" nvidia-uvm"))
        # the test package loads no nvidia-modeset: no node, so not in the spec
        assert not (scene.root / "dev/nvidia-modeset").exists()
        assert [(n["path"], n["major"], n["minor"]) for n in edits["deviceNodes"]] == [
            ("/dev/nvidiactl", 195, 255), ("/dev/nvidia-uvm", uvm_major, 0),
            ("/dev/nvidia-uvm-tools", uvm_major, 1)]
        staged = scene.root / version_dir(V1).lstrip("/")
        assert not any((staged / "bin").glob("*"))  # the test package has no tools: no mount
        assert edits["mounts"] == [
            {"hostPath": f"{version_dir(V1)}/lib64", "containerPath": "/usr/local/nvidia/lib64",
             "options": OPTIONS}]
        # no LD_LIBRARY_PATH (an image keeps its own): a hook fills the linker cache
        assert edits["env"] == ["NVIDIA_VISIBLE_DEVICES=void"]
        hook = "/home/kubernetes/bin/nvidia/cdi-hook-update-ldcache"
        assert edits["hooks"] == [{"hookName": "createContainer", "path": hook,
                                   "args": ["cdi-hook-update-ldcache",
                                            "/usr/local/nvidia/lib64"]}]
        script = scene.root / hook.lstrip("/")
        assert script.read_text().startswith("#!/bin/sh\n")
        assert oct(script.stat().st_mode & 0o777) == "0o755"
        assert oct((scene.root / SPEC).stat().st_mode & 0o777) == "0o644"

    def test_cdi_command_prints_the_spec_and_status_names_it(self, scene: Scene) -> None:
        with MirrorServer(scene.repo) as server:
            assert install(scene, server.url, V1).returncode == 0
        written = json.loads((scene.root / SPEC).read_text())
        as_json = cli(scene, "cdi")
        assert as_json.returncode == 0, as_json.stderr
        assert json.loads(as_json.stdout) == written
        as_yaml = cli(scene, "cdi", "--output", "yaml")
        assert yaml.safe_load(as_yaml.stdout) == written
        assert as_yaml.stdout.startswith("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\n")
        status = cli(scene, "status", "--output", "json")
        assert json.loads(status.stdout)["cdi"] == {
            "enabled": True, "path": "/" + SPEC, "intact": True,
            "version": f"{V1}-5.15.0-1049-gke-proprietary"}
        text = cli(scene, "status").stdout
        assert f"CDI spec:        /{SPEC} -> {V1}-5.15.0-1049-gke-proprietary" in text

    def test_eight_gpus_with_nvswitch_on_real_device_nodes(self, tmp_path: Path) -> None:
        """rocky9-h100x8 (8 H100, 4 NVSwitch): minors by PCI address, as the driver numbers
        them, from real character devices; the NVSwitch nodes are Fabric Manager's."""
        if os.geteuid() != 0:
            pytest.skip("mknod of character devices needs root")
        root = tmp_path / "node"
        build_node(root, SAMPLE_NODES["rocky9-h100x8"])
        buses = [p.address for p in SAMPLE_NODES["rocky9-h100x8"].pci if p.device == 0x2330]
        for minor, bus in enumerate(reversed(buses)):  # the driver's order need not be NVML's
            info = root / "proc/driver/nvidia/gpus" / bus / "information"
            info.parent.mkdir(parents=True)
            info.write_text(f"Model: \t\t NVIDIA H100 80GB HBM3\nDevice Minor: \t {minor}\n")
        dev = root / "dev"
        dev.mkdir(exist_ok=True)
        numbers = {**{f"nvidia{m}": (195, m) for m in range(8)}, "nvidiactl": (195, 255),
                   "nvidia-uvm": (507, 0), "nvidia-uvm-tools": (507, 1),
                   "nvidia-nvswitchctl": (509, 255),
                   **{f"nvidia-nvswitch{i}": (509, i) for i in range(4)}}
        for name, (major, minor) in numbers.items():
            os.mknod(dev / name, 0o20666, os.makedev(major, minor))
        host = RealHost(Roots(root, root / "proc", root / "sys", dev))
        gpus = [cdi.CdiGpu(i, f"GPU-{i:08x}-0000-0000-0000-000000000000",
                           f"0000{bus}".upper()) for i, bus in enumerate(buses)]
        spec = cdi.node_spec(host, PurePosixPath("/home/kubernetes/bin/nvidia"),
                             f"{V1}-x-open", gpus)
        assert spec is not None
        validate(spec)
        by_name = {d["name"]: d["containerEdits"]["deviceNodes"] for d in spec["devices"]}
        assert len(by_name) == 17
        for index in range(8):
            minor = 7 - index
            assert by_name[str(index)] == by_name[gpus[index].uuid] == [
                {"path": f"/dev/nvidia{minor}", "type": "c", "major": 195, "minor": minor,
                 "permissions": "rw"}]
        assert sorted(n["path"] for n in by_name["all"]) == sorted(
            f"/dev/nvidia{m}" for m in range(8))
        shared = [n["path"] for n in spec["containerEdits"]["deviceNodes"]]
        assert shared == ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
        assert "nvswitch" not in json.dumps(spec)
        assert spec["containerEdits"]["mounts"] == []  # nothing staged in this tree

    def test_no_gpu_means_no_spec(self, tmp_path: Path) -> None:
        root = tmp_path / "node"
        build_node(root, SAMPLE_NODES["debian12-no-gpu"])
        host = RealHost(Roots(root, root / "proc", root / "sys", root / "dev"))
        assert cdi.node_spec(host, PurePosixPath("/home/kubernetes/bin/nvidia"), V1, []) is None
        done = run_cli(["install", "--host-root", str(root), "--proc-root",
                        str(root / "proc"), "--sys-root", str(root / "sys")], dict(os.environ))
        assert done.returncode == 3 and not (root / "var").exists()
        shown = run_cli(["cdi", "--host-root", str(root), "--proc-root", str(root / "proc"),
                         "--sys-root", str(root / "sys")], dict(os.environ))
        assert shown.returncode == 12
        assert shown.stderr.strip().splitlines()[-1].count("no CDI spec to show") == 1


class TestLife:
    def test_version_switch_replaces_the_spec_atomically(self, scene: Scene) -> None:
        """A reader polling the file while v2 installs sees v1's whole spec or v2's."""
        add_version(scene, V2)
        path = scene.root / SPEC
        seen: set[str] = set()
        bad: list[str] = []
        stop = threading.Event()

        def read() -> None:
            while not stop.is_set():
                data = path.read_bytes()
                try:
                    seen.add(json.loads(data)["containerEdits"]["mounts"][0]["hostPath"])
                except (ValueError, KeyError, IndexError):
                    bad.append(data[-80:].decode(errors="replace"))

        with MirrorServer(scene.repo) as server:
            assert install(scene, server.url, V1).returncode == 0
            inode = path.stat().st_ino
            reader = threading.Thread(target=read)
            reader.start()
            try:
                done = install(scene, server.url, V2)
            finally:
                stop.set()
                reader.join()
        assert done.returncode == 0, done.stderr
        assert not bad, bad[:3]
        assert seen == {f"{version_dir(V1)}/lib64", f"{version_dir(V2)}/lib64"}
        assert path.stat().st_ino != inode  # renamed over, never rewritten in place
        assert not [p.name for p in path.parent.iterdir() if p.name != path.name]
        rolled = cli(scene, "stage", "--rollback")
        assert rolled.returncode == 0, rolled.stderr
        mounts = json.loads(path.read_text())["containerEdits"]["mounts"]
        assert mounts[0]["hostPath"] == f"{version_dir(V1)}/lib64"
        record = json.loads((scene.install_dir / ".cdi.json").read_text())
        assert record["version"] == f"{V1}-5.15.0-1049-gke-proprietary"

    def test_uninstall_removes_ours_and_leaves_a_foreign_spec(self, scene: Scene) -> None:
        foreign = scene.root / "var/run/cdi/nvidia.yaml"
        foreign.parent.mkdir(parents=True)
        foreign.write_text("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices: []\n")
        with MirrorServer(scene.repo) as server:
            done = install(scene, server.url, V1, "--output", "json")
        assert done.returncode == 0, done.stderr
        assert "var/run/cdi/nvidia.yaml also defines kind nvidia.com/gpu" in done.stderr
        assert (scene.root / SPEC).is_file()
        gone = cli(scene, "uninstall", "--output", "json")
        assert gone.returncode == 0, gone.stderr
        assert "/" + SPEC in json.loads(gone.stdout)["removed"]
        assert not (scene.root / SPEC).exists()
        assert foreign.read_text().startswith("cdiVersion: 0.5.0\nkind: nvidia.com/gpu")

    def test_a_file_at_our_path_we_did_not_write_is_never_touched(self, scene: Scene) -> None:
        path = scene.root / SPEC
        path.parent.mkdir(parents=True)
        path.write_text('{"someone": "else"}\n')
        with MirrorServer(scene.repo) as server:
            done = install(scene, server.url, V1)
        assert done.returncode == 0, done.stderr
        assert "was not written by gpu-node-installer: left untouched" in done.stderr
        assert path.read_text() == '{"someone": "else"}\n'
        assert cli(scene, "uninstall").returncode == 0
        assert path.read_text() == '{"someone": "else"}\n'

    def test_a_link_at_our_path_or_a_doctored_record_moves_nothing(self, scene: Scene
                                                                     ) -> None:
        """A link at our path is not followed (its target keeps its bytes); a record naming
        another file, even with that file's digest, deletes nothing."""
        victim = scene.root / "etc/victim.conf"
        victim.parent.mkdir(parents=True, exist_ok=True)
        victim.write_text("keep me\n")
        link = scene.root / SPEC
        link.parent.mkdir(parents=True)
        link.symlink_to("/etc/victim.conf")
        with MirrorServer(scene.repo) as server:
            done = install(scene, server.url, V1)
            assert done.returncode == 0, done.stderr
            assert "left untouched" in done.stderr
            assert os.readlink(link) == "/etc/victim.conf"
            link.unlink()
            digest = hashlib.sha256(victim.read_bytes()).hexdigest()
            (scene.install_dir / ".cdi.json").write_text(json.dumps(
                {"path": "/etc/victim.conf", "sha256": [digest], "version": "x"}))
            (scene.install_dir / ".state.json").unlink()
            assert install(scene, server.url, V1).returncode == 0
        assert victim.read_text() == "keep me\n"
        assert cli(scene, "uninstall").returncode == 0
        assert victim.read_text() == "keep me\n" and not link.exists()

    def test_our_spec_edited_by_someone_becomes_theirs(self, scene: Scene) -> None:
        with MirrorServer(scene.repo) as server:
            assert install(scene, server.url, V1).returncode == 0
            path = scene.root / SPEC
            path.write_text(path.read_text().replace("0.5.0", "0.6.0"))
            (scene.install_dir / ".state.json").unlink()  # not the fast path: a full run
            assert install(scene, server.url, V1).returncode == 0
        assert '"0.6.0"' in path.read_text()
        status = json.loads(cli(scene, "status", "--output", "json").stdout)["cdi"]
        assert status["intact"] is False

    def test_cdi_off_removes_ours_and_the_spec_dir_moves_it(self, scene: Scene) -> None:
        with MirrorServer(scene.repo) as server:
            assert install(scene, server.url, V1).returncode == 0
            moved = install(scene, server.url, V1, "--cdi-spec-dir", "/etc/cdi")
            assert moved.returncode == 0, moved.stderr
            assert not (scene.root / SPEC).exists()
            etc = scene.root / "etc/cdi/gpu-node-installer-nvidia.json"
            validate(json.loads(etc.read_text()))
            off = run_cli(["install", *scene.args("--mirror", server.url, "--allow-http",
                                                  "--driver-version", V1)],
                          {**standin_env(V1), "CDI": "off", "CDI_SPEC_DIR": "/etc/cdi"})
        assert off.returncode == 0, off.stderr
        assert not etc.exists() and not (scene.install_dir / ".cdi.json").exists()
        assert "CDI spec:        off (CDI=off)" in run_cli(
            ["status", *scene.args()], {**standin_env(V1), "CDI": "off"}).stdout

    def test_a_bad_cdi_setting_is_one_line_exit_2(self, scene: Scene) -> None:
        done = run_cli(["install", *scene.args()], {**standin_env(V1), "CDI": "maybe"})
        assert done.returncode == 2
        assert "CDI" in done.stderr.strip().splitlines()[-1]
        assert not (scene.root / "var").exists()


def test_the_module_imports_no_yaml_until_asked() -> None:
    """`cdi --output yaml` alone needs PyYAML; the signal stage must not load it."""
    probe = subprocess.run([sys.executable, "-c", "import sys, installer.stages.signal; "
                            "print('yaml' in sys.modules)"], capture_output=True, text=True,
                           check=True)
    assert probe.stdout.strip() == "False"
