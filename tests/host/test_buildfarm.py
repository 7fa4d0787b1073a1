"""The build farm: `package build --shard` in concurrent processes, then `package index`.

Every command is the real CLI in a subprocess. Headers are `nvsources.fake_kbuild` trees
whose `make modules` really runs gcc, the sources a `.run`-shaped tree with both module
trees: each build takes about a second, so the farm's rules (same split everywhere, shards
joined into the same bytes as one `--repo` build, a killed shard never listed, tampering
refused) are checked in seconds. tests/kernel/test_buildfarm_real.py does the same
against the real headers of three Debian kernels.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from buildfarm import finish, matrix_args, package_files, run_tree, start_shard
from nvsources import fake_kbuild

CLI = (sys.executable, "-m", "installer")
VERSION = "535.261.03"
RELEASES = ("6.1.0-50-amd64", "6.1.0-51-amd64", "6.1.0-52-amd64")


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "package", *args], capture_output=True, text=True,
                          timeout=300, check=False, env=env)


def _ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _error(done: subprocess.CompletedProcess[str], code: int) -> str:
    assert done.returncode == code, (done.returncode, done.stderr[-3000:])
    errors = [line for line in done.stderr.splitlines() if line.startswith("error(")]
    assert len(errors) == 1, done.stderr[-3000:]
    return errors[0]


@pytest.fixture
def farm(tmp_path: Path) -> list[str]:
    """The inputs of a 3 kernels x 2 flavours matrix, as `package build` arguments."""
    headers = [fake_kbuild(tmp_path / f"h-{r}", r, sleep=0.2) for r in RELEASES]
    return matrix_args(run_tree(tmp_path), headers, jobs=1)


def _shard(args: list[str], repo: Path, spec: str) -> subprocess.Popen[str]:
    return start_shard(args, repo, spec)


def _finish(process: subprocess.Popen[str]) -> dict[str, object]:
    result: dict[str, object] = json.loads(finish(process, timeout=300))
    return result


def test_three_concurrent_shards_join_into_the_single_build(tmp_path: Path,
                                                            farm: list[str]) -> None:
    single = tmp_path / "single"
    _ok(_cli("build", *farm, f"--repo={single}", "--alias=latest"))
    shared = tmp_path / "shared"
    processes = [_shard(farm, shared, f"{n}/3") for n in range(3)]
    results = [_finish(p) for p in processes]
    parts = [sorted((p["manifest"]["kernel_release"], p["manifest"]["flavour"])  # type: ignore
                    for p in r["packages"]) for r in results]  # type: ignore[attr-defined]
    assert [len(part) for part in parts] == [2, 2, 2]
    assert sorted(t for part in parts for t in part) == sorted(
        (r, f) for r in RELEASES for f in ("open", "proprietary"))
    assert not (shared / "index.json").exists()  # shards leave the index to `package index`
    out = _ok(_cli("index", str(shared), f"--alias=latest={VERSION}"))
    assert out.startswith(f"index {shared / 'index.json'}: 6 packages")
    assert (shared / "index.json").read_bytes() == (single / "index.json").read_bytes()
    assert package_files(shared) == package_files(single)
    first = (shared / "index.json").stat()
    _ok(_cli("index", str(shared)))  # the aliases are kept, the bytes the same
    assert (shared / "index.json").read_bytes() == (single / "index.json").read_bytes()
    assert (shared / "index.json").stat().st_mtime_ns == first.st_mtime_ns


def test_the_split_is_the_same_from_the_job_index(tmp_path: Path, farm: list[str]) -> None:
    """`--shard-count` with JOB_COMPLETION_INDEX (an Indexed Job) picks what --shard does."""
    env = {**os.environ, "JOB_COMPLETION_INDEX": "1", "GNI_SHARD_COUNT": "4"}
    by_job = json.loads(_ok(_cli("build", *farm, f"--repo={tmp_path / 'a'}", "--output=json",
                                 env=env)))
    by_flag = json.loads(_ok(_cli("build", *farm, f"--repo={tmp_path / 'b'}", "--shard=1/4",
                                  "--output=json")))
    assert by_job["shard"] == by_flag["shard"] == [1, 4]
    assert [p["digest"] for p in by_job["packages"]] == [p["digest"] for p in by_flag["packages"]]
    assert len(by_job["packages"]) == 2  # 6 tasks over 4 shards: 2, 2, 1, 1


def test_costs_balance_the_shards(tmp_path: Path, farm: list[str]) -> None:
    """A known-slow kernel gets a shard to itself; the split follows the costs file."""
    costs = tmp_path / "costs.json"
    costs.write_text(json.dumps({f"{RELEASES[0]} open": 500, f"{RELEASES[0]} proprietary": 100,
                                 f"{RELEASES[1]} open": 100}))
    result = json.loads(_ok(_cli("build", *farm, f"--repo={tmp_path / 'r'}", "--shard=0/2",
                                 f"--shard-costs={costs}", "--output=json")))
    assert [(p["manifest"]["kernel_release"], p["manifest"]["flavour"])
            for p in result["packages"]] == [(RELEASES[0], "open")]


def test_a_shard_with_nothing_to_do(tmp_path: Path, farm: list[str]) -> None:
    out = _ok(_cli("build", *farm, f"--repo={tmp_path / 'r'}", "--shard=6/7"))
    assert out.strip() == "shard 6/7: nothing to do (the matrix has fewer tasks than shards)"
    assert not (tmp_path / "r").exists() or not any((tmp_path / "r").iterdir())


@pytest.mark.parametrize(("args", "message"), [
    (["--shard=3/3"], "--shard '3/3' is not INDEX/COUNT with 0 <= INDEX < COUNT"),
    (["--shard-count=3"], "--shard-count 3 needs this shard's index"),
    (["--shard=0/2", "--alias=latest"], "--alias is set by `package index`"),
])
def test_bad_shard_options(tmp_path: Path, farm: list[str], args: list[str],
                           message: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "JOB_COMPLETION_INDEX"}
    line = _error(_cli("build", *farm, f"--repo={tmp_path / 'r'}", *args, env=env), 2)
    assert message in line and "fix:" in line
    assert not (tmp_path / "r").exists()


def test_a_killed_shard_is_not_listed_and_a_rerun_completes_it(tmp_path: Path,
                                                                farm: list[str]) -> None:
    """SIGKILL once the shard's first package is in place (its receipt is not written
    yet) and its second still compiles: `package index` lists neither."""
    repo = tmp_path / "repo"
    _finish(_shard(farm, repo, "0/2"))
    victim = _shard(farm, repo, "1/2")
    deadline = time.monotonic() + 240
    while not _in_place(repo)[3:] and time.monotonic() < deadline:
        time.sleep(0.05)
    victim.send_signal(signal.SIGKILL)
    victim.communicate()
    assert len(_in_place(repo)) >= 4  # the kill came mid-shard
    out = _ok(_cli("index", str(repo), "--output=json"))
    listed = json.loads(out)
    assert len(listed["packages"]) == 3 and listed["unrecorded"]
    index = json.loads((repo / "index.json").read_text())
    assert len(index["packages"]) == 3
    _finish(_shard(farm, repo, "1/2"))
    listed = json.loads(_ok(_cli("index", str(repo), "--output=json")))
    assert len(listed["packages"]) == 6 and listed["unrecorded"] == []


def _in_place(repo: Path) -> list[Path]:
    """Manifests of packages in place: a build's temp dir (a dot name) is not one."""
    return [m for m in repo.glob("*/*/*/manifest.json")
            if not any(part.startswith(".") for part in m.relative_to(repo).parts)]


@pytest.fixture
def indexed(tmp_path: Path, farm: list[str]) -> Path:
    repo = tmp_path / "repo"
    _finish(_shard(farm[:-2], repo, "0/1"))  # one kernel, both flavours
    _ok(_cli("index", str(repo)))
    return repo


def test_index_refuses_a_tampered_file(indexed: Path) -> None:
    before = (indexed / "index.json").read_bytes()
    module = next(indexed.glob(f"*/{VERSION}/open/modules/nvidia.ko"))
    module.write_bytes(module.read_bytes() + b"\0")
    line = _error(_cli("index", str(indexed)), 7)
    assert "modules/nvidia.ko is" in line and "the manifest says" in line
    assert (indexed / "index.json").read_bytes() == before


def test_index_refuses_a_manifest_whose_digest_is_wrong(indexed: Path) -> None:
    manifest = next(indexed.glob(f"*/{VERSION}/proprietary/manifest.json"))
    manifest.write_bytes(manifest.read_bytes().replace(b'"proprietary"', b'"proprietary" '))
    line = _error(_cli("index", str(indexed)), 7)
    assert f"{manifest.relative_to(indexed)} has sha256" in line
    assert "but its build recorded" in line


def test_index_refuses_two_packages_for_one_kernel_version_flavour(
        tmp_path: Path, farm: list[str], indexed: Path) -> None:
    other = tmp_path / "other"
    _finish(_shard([*farm[:-2], "--os-id=debian"], other, "0/1"))  # same identity, other bytes
    release = RELEASES[0]
    copy = f"{release}-copy/{VERSION}/open"
    shutil.copytree(other / release / VERSION / "open", indexed / copy)
    receipt = indexed / ".receipts" / f"{copy}.sha256"
    receipt.parent.mkdir(parents=True)
    shutil.copyfile(other / ".receipts" / release / VERSION / "open.sha256", receipt)
    line = _error(_cli("index", str(indexed)), 7)
    assert f"{release}/{VERSION}/open and {copy} are two different packages" in line
    assert f"for kernel {release}, driver {VERSION}, flavour open" in line


@pytest.mark.parametrize(("args", "message"), [
    (["--alias=newest=535.261.03"], "alias names are default, latest or a branch"),
    (["--alias=latest"], "--alias 'latest' is not NAME=VERSION"),
])
def test_index_refuses_bad_aliases(indexed: Path, args: list[str], message: str) -> None:
    assert message in _error(_cli("index", str(indexed), *args), 2)
