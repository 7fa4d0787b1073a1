"""The fetch stage and the `fetch`/`versions` commands over temp host trees and real mirrors."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from installer.cli import cli
from tests.httpserver import Fault, MirrorServer
from tests.packages import KERNEL, tar_package, write_index, write_package

LIB = "lib64/libnvidia-ml.so.535.261.03"
PKG = f"/{KERNEL}/535.261.03/proprietary"


def invoke(host: Path, *args: str, env: dict[str, str] | None = None) -> Result:
    """Run the CLI in-process against a host tree; logs are JSON lines on stderr."""
    base = ["--host-root", str(host), "--proc-root", str(host / "proc"), "--sys-root",
            str(host / "sys"), "--log-format", "json",
            "--termination-log", str(host.parent / "termination-log")]
    return CliRunner().invoke(cli, [args[0], *base, *args[1:]], env=env or {},
                              catch_exceptions=False)


def events(result: Result) -> list[dict[str, Any]]:
    return [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]


def named(result: Result, event: str) -> list[dict[str, Any]]:
    return [e for e in events(result) if e["event"] == event]


def cache_dir(host: Path) -> Path:
    return host / "home/kubernetes/bin/nvidia/.cache"


def listing(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.fixture
def host(make_node: Callable[[str], Path]) -> Path:
    return make_node("debian12-l4")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    write_package(repo, version="535.261.03")
    write_package(repo, version="535.54.03")
    write_package(repo, version="550.90.07", flavour="open")
    write_index(repo, {"default": "535"})
    return repo


class TestMirrors:
    def test_fetch_into_cache(self, host: Path, repo: Path) -> None:
        with MirrorServer(repo) as server:
            result = invoke(host, "fetch", "--mirror", server.url, "--allow-http",
                            "--output", "json")
        assert result.exit_code == 0, result.stderr
        out = json.loads(result.stdout)
        assert (out["driver_version"], out["flavour"]) == ("535.261.03", "proprietary")
        data = (repo / PKG.lstrip("/") / LIB).read_bytes()
        blob = cache_dir(host) / "blobs/sha256" / hashlib.sha256(data).hexdigest()[:2]
        assert (blob / hashlib.sha256(data).hexdigest()).read_bytes() == data
        assert named(result, "stage finished")[0]["source"].startswith("mirror ")

    def test_drop_twice_resumes_and_logs_it(self, host: Path, repo: Path) -> None:
        big = repo / PKG.lstrip("/") / LIB
        with MirrorServer(repo) as server:
            server.fault(f"{PKG}/{LIB}", Fault("drop", after=1000, times=2))
            result = invoke(host, "fetch", "--mirror", server.url, "--allow-http")
            ranges = [r.range for r in server.requests_for(f"{PKG}/{LIB}")]
        assert result.exit_code == 0, result.stderr
        assert ranges == [None, "bytes=1000-", "bytes=2000-"]
        assert [e["offset"] for e in named(result, "download resumed")] == [1000, 2000]
        sha = hashlib.sha256(big.read_bytes()).hexdigest()
        assert (cache_dir(host) / "blobs/sha256" / sha[:2] / sha).read_bytes() == big.read_bytes()

    def test_404_on_first_mirror_uses_second(self, host: Path, repo: Path) -> None:
        with MirrorServer(repo) as first, MirrorServer(repo) as second:
            first.fault(f"{PKG}/", Fault("status", status=404, times=0))
            result = invoke(host, "fetch", "--mirror", first.url, "--mirror", second.url,
                            "--allow-http", "--output", "json")
        assert result.exit_code == 0, result.stderr
        assert json.loads(result.stdout)["source"] == f"mirror {second.url}"

    def test_checksum_failure_moves_that_file_to_next_mirror(self, host: Path,
                                                             repo: Path) -> None:
        with MirrorServer(repo) as first, MirrorServer(repo) as second:
            first.fault(f"{PKG}/{LIB}", Fault("corrupt", after=10, times=0))
            env = {"DRIVER_MIRRORS": f"{first.url}, {second.url}", "DRIVER_ALLOW_HTTP": "1"}
            result = invoke(host, "fetch", env=env)
            from_second = [r.path for r in second.requests
                           if r.status == 200 and r.path != "/index.json"]
        assert result.exit_code == 0, result.stderr
        assert from_second == [f"{PKG}/{LIB}"]
        assert named(result, "file failed on mirror")[0]["file"] == LIB

    def test_failing_mirror_moves_that_file_to_next_mirror(self, host: Path,
                                                            repo: Path) -> None:
        with MirrorServer(repo) as first, MirrorServer(repo) as second:
            first.fault(f"{PKG}/{LIB}", Fault("status", status=503, times=0))
            result = invoke(host, "fetch", "--mirror", first.url, "--mirror", second.url,
                            "--allow-http", "--download-retries", "2")
            from_first = [r.status for r in first.requests_for(f"{PKG}/{LIB}")]
            from_second = [r.path for r in second.requests if r.path != "/index.json"]
        assert result.exit_code == 0, result.stderr
        assert from_first == [503, 503]
        assert from_second == [f"{PKG}/{LIB}"]

    def test_second_run_uses_cache(self, host: Path, repo: Path) -> None:
        with MirrorServer(repo) as server:
            assert invoke(host, "fetch", "--mirror", server.url, "--allow-http").exit_code == 0
            server.requests.clear()
            result = invoke(host, "fetch", "--mirror", server.url, "--allow-http",
                            "--output", "json")
            paths = [r.path for r in server.requests]
        assert result.exit_code == 0
        assert paths == ["/index.json"]
        assert json.loads(result.stdout)["source"].startswith("cache ")

    def test_exact_version_in_cache_needs_no_network(self, host: Path, repo: Path) -> None:
        with MirrorServer(repo) as server:
            invoke(host, "fetch", "--mirror", server.url, "--allow-http")
            server.requests.clear()
            result = invoke(host, "fetch", "--mirror", server.url, "--allow-http",
                            "--driver-version", "535.261.03")
            assert server.requests == []
        assert result.exit_code == 0

    def test_unreachable_mirror_falls_back_to_cache(self, host: Path, repo: Path) -> None:
        with MirrorServer(repo) as server:
            invoke(host, "fetch", "--mirror", server.url, "--allow-http")
        result = invoke(host, "fetch", "--mirror", "http://127.0.0.1:9", "--allow-http",
                        "--download-retries", "1", "--output", "json")
        assert result.exit_code == 0, result.stderr
        assert json.loads(result.stdout)["driver_version"] == "535.261.03"
        assert named(result, "source unavailable")

    def test_damaged_cache_blob_is_fetched_again(self, host: Path, repo: Path) -> None:
        with MirrorServer(repo) as server:
            invoke(host, "fetch", "--mirror", server.url, "--allow-http")
            data = (repo / PKG.lstrip("/") / LIB).read_bytes()
            sha = hashlib.sha256(data).hexdigest()
            blob = cache_dir(host) / "blobs/sha256" / sha[:2] / sha
            blob.chmod(0o644)
            blob.write_bytes(b"X" + data[1:])
            server.requests.clear()
            result = invoke(host, "fetch", "--mirror", server.url, "--allow-http")
            fetched = [r.path for r in server.requests if r.path.endswith(".so.535.261.03")]
        assert result.exit_code == 0, result.stderr
        assert fetched == [f"{PKG}/{LIB}"]
        assert blob.read_bytes() == data

    def test_interrupted_run_leftovers_removed(self, host: Path, repo: Path) -> None:
        stale = cache_dir(host) / "tmp" / "run-1-dead"
        stale.mkdir(parents=True)
        (stale / "half.part").write_bytes(b"partial")
        with MirrorServer(repo) as server:
            assert invoke(host, "fetch", "--mirror", server.url, "--allow-http").exit_code == 0
        assert list((cache_dir(host) / "tmp").iterdir()) == []

    def test_killed_mid_download_leaves_only_temp_files(self, host: Path, repo: Path) -> None:
        """SIGKILL while a file streams: nothing half-written enters the cache; the next run
        removes the leftovers and completes."""
        argv = [sys.executable, "-m", "installer", "fetch", "--host-root", str(host),
                "--proc-root", str(host / "proc"), "--sys-root", str(host / "sys"),
                "--allow-http", "--termination-log", str(host.parent / "tl")]
        tmp = cache_dir(host) / "tmp"
        with MirrorServer(repo) as server:
            server.fault(f"{PKG}/{LIB}", Fault("stall", after=1000, seconds=30))
            proc = subprocess.Popen([*argv, "--mirror", server.url], stderr=subprocess.PIPE)
            try:
                for _ in range(600):  # until the stalled file has bytes on disk (bounded)
                    if any(p.stat().st_size > 0 for p in tmp.glob("run-*/*")
                           if p.is_file() and LIB.rsplit("/", 1)[1] in p.name):
                        break
                    proc.poll()
                    assert proc.returncode is None, proc.stderr.read() if proc.stderr else ""
                    time.sleep(0.05)
            finally:
                proc.kill()
                proc.wait()
            blobs = {p.name for p in (cache_dir(host) / "blobs").rglob("*") if p.is_file()}
            lib_sha = hashlib.sha256((repo / PKG.lstrip("/") / LIB).read_bytes()).hexdigest()
            assert lib_sha not in blobs
            assert list(tmp.glob("run-*"))
            again = subprocess.run([*argv, "--mirror", server.url], capture_output=True)
        assert again.returncode == 0, again.stderr
        assert list(tmp.iterdir()) == []

    def test_cache_keep_prunes_old_packages(self, host: Path, repo: Path) -> None:
        with MirrorServer(repo) as server:
            for version in ("535.54.03", "550.90.07", "535.261.03"):
                result = invoke(host, "fetch", "--mirror", server.url, "--allow-http",
                                "--driver-version", version, "--cache-keep", "1")
                assert result.exit_code == 0, result.stderr
        refs = list((cache_dir(host) / "refs").glob("*.json"))
        assert len(refs) == 1
        assert json.loads(refs[0].read_text())["driver_version"] == "535.261.03"
        assert named(result, "cache pruned")

    def test_not_found_lists_versions(self, host: Path, repo: Path) -> None:
        with MirrorServer(repo) as server:
            result = invoke(host, "fetch", "--mirror", server.url, "--allow-http",
                            "--driver-version", "560")
        assert result.exit_code == 5
        line = result.stderr.strip().splitlines()[-1]
        assert line.startswith("error(package-not-found): [fetch] no driver package 560")
        assert "535.261.03 (proprietary), 535.54.03 (proprietary)" in line

        assert "DRIVER_MIRRORS" not in line  # a mirror is set: it is not the cause

    def test_no_mirror_set_names_the_setting(self, host: Path) -> None:
        """A fresh deploy with no mirror: the line says so and how to set one."""
        result = invoke(host, "fetch")
        assert result.exit_code == 5
        line = result.stderr.strip().splitlines()[-1]
        assert "no mirror is set (DRIVER_MIRRORS is empty); fix: set DRIVER_MIRRORS " \
               "(--mirror) to a driver repository" in line, line

    def test_plain_http_needs_opt_in(self, host: Path, repo: Path) -> None:
        result = invoke(host, "fetch", "--mirror", "http://127.0.0.1:9")
        assert result.exit_code == 2
        assert "--allow-http" in result.stderr

    def test_proxy_from_environment(self, host: Path, repo: Path) -> None:
        """The mirror's name does not resolve; only the proxy in HTTP_PROXY can reach it."""
        with MirrorServer(repo) as proxy:
            env = {"HTTP_PROXY": proxy.url, "http_proxy": proxy.url, "NO_PROXY": "",
                   "no_proxy": ""}
            result = invoke(host, "fetch", "--mirror", "http://mirror.invalid:8080",
                            "--allow-http", "--output", "json", env=env)
            proxied = proxy.proxied
        assert result.exit_code == 0, result.stderr
        assert json.loads(result.stdout)["source"] == "mirror http://mirror.invalid:8080"
        assert proxied >= 6  # index, manifest, four files

    def test_credentials_never_logged(self, host: Path, repo: Path) -> None:
        with MirrorServer(repo) as server:
            url = server.url.replace("http://", "http://reader:s3cret@")
            result = invoke(host, "fetch", "--mirror", url, "--allow-http", "--output", "json")
        assert result.exit_code == 0, result.stderr
        assert "s3cret" not in result.stdout + result.stderr
        assert json.loads(result.stdout)["source"] == f"mirror {server.url}"

    def test_file_mirror(self, host: Path, repo: Path) -> None:
        result = invoke(host, "fetch", "--mirror", f"file://{repo}", "--output", "json")
        assert result.exit_code == 0, result.stderr
        assert json.loads(result.stdout)["source"] == f"mirror file://{repo}"

    def test_versions_command(self, host: Path, repo: Path) -> None:
        with MirrorServer(repo) as server:
            text = invoke(host, "versions", "--mirror", server.url, "--allow-http")
            js = invoke(host, "versions", "--mirror", server.url, "--allow-http",
                        "--output", "json")
        assert text.exit_code == 0, text.stderr
        assert "550.90.07 (open), 535.261.03 (proprietary), 535.54.03 (proprietary)" in text.stdout
        assert "default -> 535.261.03 (proprietary)" in text.stdout
        assert json.loads(js.stdout)["resolved"] == "535.261.03 (proprietary)"


class TestPreloaded:
    def test_tree_wins_without_network(self, host: Path, repo: Path) -> None:
        with MirrorServer(repo) as server:
            result = invoke(host, "fetch", "--preloaded-dir", str(repo), "--mirror", server.url,
                            "--allow-http", "--driver-version", "535.261.03",
                            "--output", "json")
            assert server.requests == []
        assert result.exit_code == 0, result.stderr
        assert json.loads(result.stdout)["source"] == f"preloaded {repo}"

    def test_alias_from_preloaded_index(self, host: Path, repo: Path) -> None:
        result = invoke(host, "fetch", "--preloaded-dir", str(repo), "--output", "json")
        assert result.exit_code == 0, result.stderr
        assert json.loads(result.stdout)["driver_version"] == "535.261.03"

    def test_tarball(self, host: Path, repo: Path, tmp_path: Path) -> None:
        preloaded = tmp_path / "preloaded"
        (preloaded / KERNEL / "535.261.03").mkdir(parents=True)
        tar_package(repo / PKG.lstrip("/"), preloaded / KERNEL / "535.261.03" /
                    "proprietary.tar.gz")
        result = invoke(host, "fetch", "--preloaded-dir", str(preloaded), "--output", "json")
        assert result.exit_code == 0, result.stderr
        assert json.loads(result.stdout)["source"].endswith("proprietary.tar.gz")
        assert (cache_dir(host) / "refs").is_dir()

    def test_broken_preloaded_falls_through_to_mirror(self, host: Path, repo: Path,
                                                      tmp_path: Path) -> None:
        preloaded = tmp_path / "preloaded"
        write_package(preloaded)
        (preloaded / PKG.lstrip("/") / LIB).write_bytes(b"tampered")
        with MirrorServer(repo) as server:
            result = invoke(host, "fetch", "--preloaded-dir", str(preloaded), "--mirror",
                            server.url, "--allow-http", "--output", "json")
        assert result.exit_code == 0, result.stderr
        assert json.loads(result.stdout)["source"] == f"mirror {server.url}"
        assert named(result, "source failed")[0]["error"] == "integrity"


BAD = {
    "absolute path": lambda m: m["files"][0].update(path="/etc/passwd"),
    "dot-dot": lambda m: m["files"][0].update(path="../../../etc/cron.d/x"),
    "100 GB file": lambda m: m["files"][0].update(size=100 * 1024**3),
    "unknown kind": lambda m: m["files"][0].update(kind="script"),
    "schema 2": lambda m: m.update(schema_version=2),
    "wrong kernel": lambda m: m.update(kernel_release="6.1.0-99-amd64"),
}


class TestBadInput:
    """A bad manifest or index: one line, exit 7, nothing written outside the cache temp area."""

    @pytest.mark.parametrize("case", list(BAD))
    def test_bad_manifest(self, host: Path, repo: Path, case: str) -> None:
        index = json.loads((repo / "index.json").read_text())
        for entry in index["packages"]:
            entry["manifest_sha256"] = None  # so the manifest's own validation is what fails
        (repo / "index.json").write_text(json.dumps(index))
        path = repo / PKG.lstrip("/") / "manifest.json"
        doc = json.loads(path.read_text())
        BAD[case](doc)
        path.write_text(json.dumps(doc))
        self._refused(host, repo, exit_code=7)

    @pytest.mark.parametrize("data", [b"{not json", b'{"schema_version": 7}', b"[]"])
    def test_bad_index(self, host: Path, repo: Path, data: bytes) -> None:
        # a malformed index is an integrity error naming it, not "not found"
        (repo / "index.json").write_bytes(data)
        result = self._refused(host, repo, exit_code=7)
        assert named(result, "source unavailable")
        assert "index.json from mirror http://127.0.0.1" in result.stderr

    def test_manifest_differs_from_index(self, host: Path, repo: Path) -> None:
        path = repo / PKG.lstrip("/") / "manifest.json"
        path.write_bytes(path.read_bytes().replace(b'"os": null', b'"os": {"id": "debian"}'))
        result = self._refused(host, repo, exit_code=7)
        assert "differs from the digest index.json gives" in result.stderr

    def _refused(self, host: Path, repo: Path, *, exit_code: int) -> Result:
        before = listing(host)
        with MirrorServer(repo) as server:
            result = invoke(host, "fetch", "--mirror", server.url, "--allow-http")
        assert result.exit_code == exit_code, result.stderr
        lines = [line for line in result.stderr.splitlines() if line.startswith("error(")]
        assert len(lines) == 1
        new = listing(host) - before
        assert all(p.startswith("home/kubernetes/bin/nvidia/.cache/tmp") or p in (
            "home", "home/kubernetes", "home/kubernetes/bin", "home/kubernetes/bin/nvidia",
            "home/kubernetes/bin/nvidia/.cache", "home/kubernetes/bin/nvidia/.lock")
            for p in new), new
        return result


def test_cli_import_does_not_load_requests() -> None:
    code = ("import sys, installer.cli; "
            "sys.exit(1 if {'requests', 'tenacity', 'urllib3'} & set(sys.modules) else 0)")
    done = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parents[2],
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})
    assert done.returncode == 0
