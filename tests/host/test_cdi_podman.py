"""A real runtime reads our CDI spec: Debian's Podman, rootful, runs containers
with `--device nvidia.com/gpu=all` and `--device nvidia.com/gpu=<UUID>` from the spec a real
`install` wrote, after `signal` (the real CLI, RealHost) rewrote it from real character
devices with NVIDIA's numbers (mknod in the host tree).

Podman 4.3 (bookworm) has no `--cdi-spec-dir`: it reads /etc/cdi and /var/run/cdi only. So
each run happens in a private mount namespace (`unshare -m`) where /etc is an overlay (the
machine's /etc below, a tmpfs above) whose `cdi/` is the host tree's spec directory, and
/home/kubernetes is the host tree's: the spec's paths are the real node paths, and nothing
of the machine's /etc, /var/run/cdi or /home is written. The device nodes inside the
container are made by runc from the spec's numbers. One image (the deploy tests' local
bookworm base, imported without a registry), four container runs in all; then one more on
a MIG node (`--device nvidia.com/gpu=0:1`): that instance's GPU and capability nodes only."""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from deploy import podman
from e2e import Scene, add_version, make_scene, run_cli, standin_env
from httpserver import MirrorServer

V1, V2 = "535.261.03", "535.309.01"
pytestmark = pytest.mark.timeout(1800)  # a cold cache first builds the base rootfs
SPEC = "var/run/cdi/gpu-node-installer-nvidia.json"
# What runs in the container: the device nodes, the library mount's options, a write that
# must fail, and the dynamic linker finding libnvidia-ml.so.1 and libcuda.so.1 by SONAME.
PROBE = r"""
import ctypes, errno, json, os, stat
out = {"nodes": {}, "mount": None}
names = [n for n in os.listdir("/dev") if n.startswith("nvidia") and n != "nvidia-caps"]
if os.path.isdir("/dev/nvidia-caps"):
    names += ["nvidia-caps/" + n for n in os.listdir("/dev/nvidia-caps")]
for name in sorted(names):
    info = os.lstat("/dev/" + name)
    out["nodes"][name] = [stat.S_ISCHR(info.st_mode), os.major(info.st_rdev),
                          os.minor(info.st_rdev)]
for line in open("/proc/self/mountinfo"):
    fields = line.split()
    if fields[4] == "/usr/local/nvidia/lib64":
        out["mount"] = fields[5].split(",")
try:
    open("/usr/local/nvidia/lib64/written-by-a-container", "w")
    out["write"] = "allowed"
except OSError as exc:
    out["write"] = errno.errorcode[exc.errno]
nvml = ctypes.CDLL("libnvidia-ml.so.1")
out["nvmlInit"] = nvml.nvmlInit_v2()
buf = ctypes.create_string_buffer(96)
out["nvmlDriver"] = [nvml.nvmlSystemGetDriverVersion(buf, 96), buf.value.decode()]
cuda = ctypes.CDLL("libcuda.so.1")
version = ctypes.c_int()
out["cuDriverGetVersion"] = [cuda.cuDriverGetVersion(ctypes.byref(version)), version.value]
out["loaded"] = sorted({l.split()[-1] for l in open("/proc/self/maps")
                        if "libnvidia-ml" in l or "libcuda" in l})
out["env"] = os.environ.get("LD_LIBRARY_PATH")
if os.path.exists("/usr/local/bin/nvidia-smi"):
    import subprocess
    smi = subprocess.run(["nvidia-smi"], capture_output=True, text=True)
    out["smi"] = [smi.returncode, smi.stdout.strip(), smi.stderr.strip()[-300:]]
print(json.dumps(out))
"""
# A stand-in nvidia-smi as the real one links: DT_NEEDED libnvidia-ml.so.1, found by the
# dynamic linker (LD_LIBRARY_PATH, then the linker cache), never dlopen'ed by path.
SMI_SOURCE = r"""
#include <stdio.h>
int nvmlInit_v2(void);
int nvmlSystemGetDriverVersion(char *version, unsigned int length);
int main(void) {
    char version[96] = "";
    int init = nvmlInit_v2(), got = nvmlSystemGetDriverVersion(version, sizeof version);
    printf("Driver Version: %s\n", version);
    return init || got;
}
"""


@pytest.fixture(scope="module")
def base() -> str:
    reason = podman.why_podman_cannot_run()
    if reason is not None:
        pytest.skip(reason)
    if os.geteuid() != 0:
        pytest.fail("rootful podman and mknod need root (the image tests run as root too)")
    return podman.base_image()[0]


def realize_device_nodes(dev: Path, caps: bool = False) -> dict[str, tuple[int, int]]:
    """The simulated kernel writes `char MAJ:MIN` files; make them real character devices
    (`caps`: the MIG capability nodes too; a later simulated load could not read those back).
    Returns every node's numbers as the host tree has them now."""
    paths = sorted([*dev.glob("nvidia*"), *(dev.glob("nvidia-caps/*") if caps else ())])
    for path in paths:
        if path.is_file() and not path.is_symlink():
            major, minor = map(int, path.read_text().split()[1].split(":"))
            path.unlink()
            os.mknod(path, 0o20666, os.makedev(major, minor))
            os.chmod(path, 0o666)
    nodes = {str(p.relative_to(dev)): p.lstat() for p in paths if not p.is_dir()}
    assert all(stat.S_ISCHR(info.st_mode) for info in nodes.values())
    return {name: (os.major(i.st_rdev), os.minor(i.st_rdev)) for name, i in nodes.items()}


def install_and_signal(scene: Scene, mirror: str, version: str) -> dict[str, tuple[int, int]]:
    done = run_cli(["install", *scene.args("--mirror", mirror, "--driver-version", version,
                                           "--allow-http")], standin_env(version))
    assert done.returncode == 0, done.stderr[-3000:]
    made = realize_device_nodes(scene.root / "dev")
    signal = subprocess.run([sys.executable, "-m", "installer", "signal", *scene.args()],
                            env=standin_env(version), capture_output=True, text=True,
                            timeout=120, check=False, cwd=Path(__file__).resolve().parents[2])
    assert signal.returncode == 0, signal.stderr[-3000:]
    return made


def containers(scene: Scene, image: str, devices: list[str], work: Path,
               extra: tuple[str, ...] = ()) -> list[dict[str, object]]:
    """One container per device name, all in one private mount namespace."""
    runs = [shlex.join(["podman", *podman.GLOBAL, "run", *podman.RUN, "--device", device,
                        *extra, "--entrypoint", "python3", image, "-c", PROBE])
            for device in devices]
    overlay = work / "etc-overlay"
    script = "\n".join([
        "set -e",
        f"mkdir -p {overlay}", f"mount -t tmpfs tmpfs {overlay}",
        f"mkdir -p {overlay}/up/cdi {overlay}/work",
        f"mount -t overlay overlay -o lowerdir=/etc,upperdir={overlay}/up,"
        f"workdir={overlay}/work /etc",
        f"mount --bind {scene.root / 'var/run/cdi'} /etc/cdi",
        "mount -t tmpfs tmpfs /home", "mkdir /home/kubernetes",
        f"mount --bind {scene.root / 'home/kubernetes'} /home/kubernetes",
        *runs])
    done = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def test_podman_runs_gpu_containers_from_our_spec(base: str, tmp_path: Path) -> None:
    scene = make_scene(tmp_path)
    add_version(scene, V1)
    add_version(scene, V2)
    with MirrorServer(scene.repo) as server:
        made = install_and_signal(scene, server.url, V1)
        spec = json.loads((scene.root / SPEC).read_text())
        uuid = spec["devices"][1]["name"]
        assert uuid.startswith("GPU-")
        every, one = containers(scene, base, ["nvidia.com/gpu=all", f"nvidia.com/gpu={uuid}"],
                                tmp_path)
        made_v2 = install_and_signal(scene, server.url, V2)
        (after,) = containers(scene, base, ["nvidia.com/gpu=0"], tmp_path / "v2")

    expected = {name: [True, major, minor] for name, (major, minor) in made.items()
                if name != "nvidia-modeset"}
    assert set(expected) == {"nvidia0", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"}
    for seen in (every, one):
        assert seen["nodes"] == expected
        assert {"ro", "nosuid", "nodev"} <= set(seen["mount"])  # type: ignore[arg-type]
        assert seen["write"] == "EROFS"
        assert seen["nvmlInit"] == 0 and seen["nvmlDriver"] == [0, V1]
        assert seen["cuDriverGetVersion"][0] == 0  # type: ignore[index]
        assert seen["loaded"] == [f"/usr/local/nvidia/lib64/libcuda.so.{V1}",
                                  f"/usr/local/nvidia/lib64/libnvidia-ml.so.{V1}"]
        assert seen["env"] is None  # the spec sets none; the hook's linker cache serves
    assert after["nodes"] == {name: [True, major, minor]
                              for name, (major, minor) in made_v2.items()
                              if name != "nvidia-modeset"}
    assert after["loaded"] == [f"/usr/local/nvidia/lib64/libcuda.so.{V2}",
                               f"/usr/local/nvidia/lib64/libnvidia-ml.so.{V2}"]
    assert not list((scene.root / "home/kubernetes/bin/nvidia").rglob("written-by-a-*"))


def test_podman_runs_a_mig_device_from_our_spec(base: str, tmp_path: Path) -> None:
    """An H100 split into 2x3g.40gb by a real `install` (the MIG stand-in, the simulated
    kernel); `signal` (RealHost) rewrites the spec from real nodes; a container asking for
    MIG device 0:1 gets /dev/nvidia0 and exactly GI 2's and its CI 0's capability nodes."""
    from mignode import H100, mig_node

    node = mig_node(tmp_path, H100, 1)
    done = node.install("--mig-profile", "3g.40gb")
    assert done.returncode == 0, done.stderr[-3000:]
    made = realize_device_nodes(node.scene.root / "dev", caps=True)
    signal = subprocess.run([sys.executable, "-m", "installer", "signal", *node.scene.args()],
                            env=node.env, capture_output=True, text=True, timeout=120,
                            check=False, cwd=Path(__file__).resolve().parents[2])
    assert signal.returncode == 0, signal.stderr[-3000:]
    spec = json.loads((node.scene.root / SPEC).read_text())
    names = [d["name"] for d in spec["devices"]]
    assert names[:4:2] == ["0:0", "0:1"] and names[3].startswith("MIG-")
    (seen,) = containers(node.scene, base, ["nvidia.com/gpu=0:1"], tmp_path)

    gi, ci = 3 + 9 * 2, 4 + 9 * 2  # mig-minors: gpu0/gi2/access, gpu0/gi2/ci0/access
    wanted = ["nvidia0", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools",
              f"nvidia-caps/nvidia-cap{gi}", f"nvidia-caps/nvidia-cap{ci}"]
    assert seen["nodes"] == {name: [True, *made[name]] for name in sorted(wanted)}
    assert seen["nvmlInit"] == 0 and seen["nvmlDriver"] == [0, V1]
    assert {"nvidia-caps/nvidia-cap1", "nvidia-caps/nvidia-cap2"} <= set(made)  # not given


def own_path_image() -> str:
    """The base with `ENV LD_LIBRARY_PATH=/opt/own/lib`, as an image that sets its own."""
    tarball, tag, _ = podman.base_tarball()
    own = tag.replace("gni-test-base", "gni-test-own-ldpath")
    if podman.podman("image", "exists", own, check=False).returncode != 0:
        podman.podman("import", "--change", "ENV LD_LIBRARY_PATH=/opt/own/lib", "--change",
                      'CMD ["/bin/sh"]', str(tarball), own, timeout=300)
    return own


def test_an_image_keeps_its_own_library_path(base: str, tmp_path: Path) -> None:
    """The spec sets no LD_LIBRARY_PATH; its createContainer hook puts the driver's
    libraries in the container's linker cache (as nvidia-ctk's update-ldcache): an image's
    own value and a user's `-e` are kept, and a stand-in nvidia-smi linked against
    libnvidia-ml.so.1 still finds it."""
    scene = make_scene(tmp_path)
    add_version(scene, V1)
    with MirrorServer(scene.repo) as server:
        install_and_signal(scene, server.url, V1)
    spec = json.loads((scene.root / SPEC).read_text())
    assert spec["containerEdits"]["env"] == ["NVIDIA_VISIBLE_DEVICES=void"]
    assert [h["hookName"] for h in spec["containerEdits"]["hooks"]] == ["createContainer"]
    lib64 = next((scene.install_dir / ".versions").glob("*/lib64"))
    smi = tmp_path / "nvidia-smi"
    source = tmp_path / "smi.c"
    source.write_text(SMI_SOURCE)
    subprocess.run(["cc", "-o", str(smi), str(source), f"-L{lib64}", "-l:libnvidia-ml.so.1"],
                   check=True, capture_output=True, timeout=60)
    mount = ("-v", f"{smi}:/usr/local/bin/nvidia-smi:ro")
    (own,) = containers(scene, own_path_image(), ["nvidia.com/gpu=0"], tmp_path / "own",
                        mount)
    (user,) = containers(scene, base, ["nvidia.com/gpu=0"], tmp_path / "user",
                         (*mount, "-e", "LD_LIBRARY_PATH=/opt/user/lib"))
    assert own["env"] == "/opt/own/lib"
    assert user["env"] == "/opt/user/lib"
    for seen in (own, user):
        assert seen["smi"] == [0, f"Driver Version: {V1}", ""], seen
        assert seen["nvmlInit"] == 0 and seen["nvmlDriver"] == [0, V1]
        assert seen["loaded"] == [f"/usr/local/nvidia/lib64/libcuda.so.{V1}",
                                  f"/usr/local/nvidia/lib64/libnvidia-ml.so.{V1}"]
