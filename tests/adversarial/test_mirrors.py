"""Mirrors and downloads that cannot be turned against the run.

Each case runs the real CLI against real mirrors on 127.0.0.1 (tests/httpserver.py, TLS
included) or file:// trees, and asserts the exit code (or success), the one line naming
the cause, no traceback, and that nothing outside the installer's own area changed.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from httpserver import Fault, MirrorServer, self_signed

from adversarial.harness import VERSION, WORK_AREA, Arena, Result, assert_refused
from adversarial.mirrorkit import (
    CACHE,
    LIB,
    PKG,
    assert_fetched,
    assert_only,
    copy_repo,
    edit_manifest,
    fetch,
    fetch_ok,
    fetch_refused,
    good,
    set_manifest_bytes,
    warned,
)

# ---------------------------------------------------------------- helpers


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (also its own CA bundle) and its key."""
    return self_signed(tmp_path_factory.mktemp("tls"))


@contextmanager
def redirecting(arena: Arena, tls: tuple[Path, Path], path: str, status: int,
                plain: MirrorServer) -> Iterator[MirrorServer]:
    """A TLS mirror of the good repository whose `path` redirects (`status`) to the plain-http
    mirror's index."""
    with MirrorServer(copy_repo(arena, "tls"), tls=tls) as server:
        server.fault(path, Fault("redirect", status=status, times=0,
                                 other=f"{plain.url}/index.json".encode()))
        yield server


# ---------------------------------------------------------------- one bad mirror, one good


def _index_junk(repo: Path) -> None:
    (repo / "index.json").write_bytes(b"{not json")


def _index_huge(repo: Path) -> None:
    (repo / "index.json").write_bytes(b" " * (17 * 1024**2) + b"{}")


def _index_traversal(repo: Path) -> None:
    index = json.loads((repo / "index.json").read_text())
    index["packages"][0]["path"] = f"%2e%2e%2f%2e%2e%2f{PKG}"
    (repo / "index.json").write_text(json.dumps(index))


def _manifest_wrong_hash(repo: Path) -> None:
    path = repo / PKG / "manifest.json"
    path.write_bytes(path.read_bytes().replace(b'"os": null', b'"os": {"id": "debian"}'))


def _manifest_wrong_identity(repo: Path) -> None:
    edit_manifest(repo, lambda doc: doc.update(driver_version="535.999.99"))


def _manifest_junk(repo: Path) -> None:
    set_manifest_bytes(repo, b'{"schema_version": 1, "files": [')


def _manifest_huge(repo: Path) -> None:
    set_manifest_bytes(repo, b" " * (9 * 1024**2) + b"{}")


def _file_corrupt(repo: Path) -> None:
    lib = repo / LIB
    data = bytearray(lib.read_bytes())
    data[100] ^= 0xFF
    lib.write_bytes(bytes(data))


def _empty(repo: Path) -> None:
    shutil.rmtree(repo)
    repo.mkdir()


SPOILED = {
    "index not JSON": (_index_junk, "not valid JSON"),
    "index oversize": (_index_huge, "more than the"),
    "index path climbs out": (_index_traversal, "path"),
    "manifest differs from the index's digest": (_manifest_wrong_hash, "differs from the digest"),
    "manifest of another version": (_manifest_wrong_identity, "manifest is for"),
    "manifest not JSON": (_manifest_junk, "not valid JSON"),
    "manifest oversize": (_manifest_huge, "bytes allowed"),
    "file with the wrong sha256": (_file_corrupt, "sha256"),
    "mirror holds nothing (404)": (_empty, "404"),
}


@pytest.mark.parametrize("case", list(SPOILED))
def test_a_spoiled_first_mirror_falls_through_to_a_good_one(
        arena: Arena, http_bad: tuple[MirrorServer, Path], case: str) -> None:
    server, repo = http_bad
    spoil, _cause = SPOILED[case]
    spoil(repo)
    done = fetch_ok(arena, [server.url, good(arena)], extra=("--allow-http",))
    assert warned(done, server.url), done.stderr[-3000:]


@pytest.mark.parametrize("case", ["index not JSON", "manifest of another version",
                                  "manifest oversize", "file with the wrong sha256",
                                  "mirror holds nothing (404)", "index path climbs out"])
def test_a_spoiled_only_mirror_names_its_cause(
        arena: Arena, http_bad: tuple[MirrorServer, Path], case: str) -> None:
    server, repo = http_bad
    spoil, cause = SPOILED[case]
    spoil(repo)
    code = 5 if "404" in case else 7
    done = fetch_refused(arena, [server.url], code, f"mirror {server.url}", cause,
                         extra=("--allow-http",),
                         prefixes=CACHE if "sha256" in case else WORK_AREA)
    assert "package-not-found" not in done.lines[0] or code == 5


def test_server_errors_on_the_first_mirror_fall_through(
        arena: Arena, http_bad: tuple[MirrorServer, Path]) -> None:
    server, _repo = http_bad
    server.fault("/", Fault("status", status=500, times=0))
    fetch_ok(arena, [server.url, good(arena)], extra=("--allow-http",))


def test_a_hostile_index_document_falls_through(
        arena: Arena, http_bad: tuple[MirrorServer, Path]) -> None:
    server, _repo = http_bad
    server.fault("/index.json", Fault("serve", other=b'{"schema_version": 1, "packages": 7}'))
    done = fetch(arena, server.url, good(arena), extra=("--allow-http",))
    assert_fetched(done)
    assert warned(done, "must be a list")


def test_tls_failure_on_the_first_mirror_falls_through(arena: Arena,
                                                       tls: tuple[Path, Path]) -> None:
    with MirrorServer(copy_repo(arena, "tls"), tls=tls) as server:
        done = fetch_ok(arena, [server.url, good(arena)])
    assert warned(done, "TLS verification failed")


def test_a_redirect_to_plain_http_falls_through(arena: Arena, tls: tuple[Path, Path],
                                                http_bad: tuple[MirrorServer, Path]) -> None:
    plain, _repo = http_bad
    with redirecting(arena, tls, "/index.json", 302, plain) as server:
        done = fetch(arena, server.url, good(arena), extra=("--ca-bundle", str(tls[0])))
    assert_fetched(done)
    assert warned(done, "redirected to plain http")
    assert not plain.requests, "the plain-http target must never be contacted"


def test_a_trickling_first_mirror_is_dropped_after_the_read_timeout(
        arena: Arena, http_bad: tuple[MirrorServer, Path]) -> None:
    server, _repo = http_bad
    server.fault("/index.json", Fault("trickle", after=1, seconds=0.5, times=0))
    started = time.monotonic()
    done = fetch(arena, server.url, good(arena),
                 extra=("--allow-http", "--read-timeout", "1", "--download-retries", "1"))
    assert_fetched(done)
    assert time.monotonic() - started < 10
    assert warned(done, "trickles")


def test_retry_after_beyond_the_deadline_moves_to_the_next_mirror(
        arena: Arena, http_bad: tuple[MirrorServer, Path]) -> None:
    server, _repo = http_bad
    server.fault("/index.json", Fault("retry_after", retry_after=3600, times=0))
    started = time.monotonic()
    done = fetch(arena, server.url, good(arena),
                 extra=("--allow-http", "--download-deadline", "60"))
    assert_fetched(done)
    assert time.monotonic() - started < 10
    assert warned(done, "asked to wait 3600 s")


# ---------------------------------------------------------------- every mirror bad


def test_tls_unknown_ca_says_so_and_points_at_the_ca_bundle(arena: Arena,
                                                            tls: tuple[Path, Path]) -> None:
    with MirrorServer(copy_repo(arena, "tls"), tls=tls) as server:
        done = fetch_refused(arena, [server.url], 6, "TLS verification failed for mirror",
                             server.url, "--ca-bundle", "DRIVER_CA_BUNDLE")
    assert "package-not-found" not in done.lines[0]


def test_all_bad_each_cause_named_integrity_outranks_tls(
        arena: Arena, tls: tuple[Path, Path], http_bad: tuple[MirrorServer, Path]) -> None:
    plain, repo = http_bad
    _index_junk(repo)
    with MirrorServer(copy_repo(arena, "tls"), tls=tls) as secure:
        fetch_refused(arena, [secure.url, plain.url], 7,
                      f"mirror {secure.url}: TLS verification failed", f"mirror {plain.url}",
                      "not valid JSON", extra=("--allow-http",))


def test_all_bad_server_error_and_404_is_a_download_failure(
        arena: Arena, http_bad: tuple[MirrorServer, Path]) -> None:
    server, _repo = http_bad
    server.fault("/", Fault("status", status=503, times=0))
    empty = arena.base / "empty"
    empty.mkdir()
    done = fetch(arena, server.url, f"file://{empty}", extra=("--allow-http",))
    assert_refused(done, 6, "HTTP 503", "does not exist", f"mirror file://{empty}")


def test_all_missing_is_package_not_found_naming_each(arena: Arena) -> None:
    first, second = arena.base / "m1", arena.base / "m2"
    first.mkdir()
    second.mkdir()
    done = fetch(arena, f"file://{first}", f"file://{second}")
    assert_refused(done, 5, f"mirror file://{first}", f"mirror file://{second}")


def test_only_a_redirect_to_http_is_refused(arena: Arena, tls: tuple[Path, Path],
                                            http_bad: tuple[MirrorServer, Path]) -> None:
    plain, _repo = http_bad
    with redirecting(arena, tls, "/", 301, plain) as server:
        done = fetch(arena, server.url, extra=("--ca-bundle", str(tls[0]),
                                               "--driver-version", VERSION))
    assert_refused(done, 6, "redirected to plain http://", "--allow-http")
    assert not plain.requests


def test_retry_after_beyond_the_deadline_says_so(
        arena: Arena, http_bad: tuple[MirrorServer, Path]) -> None:
    server, _repo = http_bad
    server.fault("/", Fault("retry_after", retry_after=900, times=0))
    started = time.monotonic()
    done = fetch(arena, server.url, extra=("--allow-http", "--download-deadline", "30"))
    assert_refused(done, 6, "mirror asked to wait 900 s, beyond the download deadline")
    assert "package-not-found" not in done.lines[0]
    assert time.monotonic() - started < 10


# ---------------------------------------------------------------- the deadline mid-stream

DEADLINE = 3.0


@pytest.mark.parametrize("where", ["library body", "index body", "response headers"])
def test_a_trickling_mirror_cannot_outlast_the_deadline(
        arena: Arena, http_bad: tuple[MirrorServer, Path], where: str) -> None:
    server, _repo = http_bad
    if where == "library body":
        server.fault(f"/{LIB}", Fault("trickle", after=4096, seconds=1.0, times=0))
    elif where == "index body":
        server.fault("/index.json", Fault("trickle", after=10, seconds=1.0, times=0))
    else:
        server.fault("/index.json", Fault("slow_headers", seconds=1.0, times=0))
    before = arena.snapshot()
    started = time.monotonic()
    done = fetch(arena, server.url, extra=("--allow-http", "--download-deadline", str(DEADLINE),
                                           "--read-timeout", "30"), timeout=30)
    took = time.monotonic() - started
    assert_refused(done, 6, f"download deadline of {DEADLINE:g} s", server.url)
    # the whole run, Python's start-up on a loaded machine included; without the deadline
    # the trickle lasts until the 30 s read timeout
    assert took < DEADLINE + 6, took
    assert_only(before, arena.snapshot(), CACHE)


def test_the_deadline_is_for_the_whole_run_not_per_mirror(
        arena: Arena, http_bad: tuple[MirrorServer, Path]) -> None:
    server, _repo = http_bad
    server.fault(f"/{LIB}", Fault("trickle", after=4096, seconds=1.0, times=0))
    started = time.monotonic()
    done = fetch(arena, server.url, good(arena),
                 extra=("--allow-http", "--download-deadline", str(DEADLINE)), timeout=30)
    assert_refused(done, 6, "download deadline")
    assert time.monotonic() - started < DEADLINE + 2


# ---------------------------------------------------------------- no secrets in output

SECRET_USER, SECRET_PASS, TOKEN = "opsbot", "hunter2pass", "tok3nSECRETvalue"


def secret_url(url: str) -> str:
    scheme, rest = url.split("://", 1)
    return f"{scheme}://{SECRET_USER}:{SECRET_PASS}@{rest}/repo?token={TOKEN}"


def assert_no_secret(arena: Arena, *results: Result) -> None:
    """Neither the password, the user nor the token in any output or file of the node."""
    files = [p for p in [*arena.root.rglob("*"), arena.termination_log] if p.is_file()]
    for secret in (SECRET_USER, SECRET_PASS, TOKEN):
        for result in results:
            assert secret not in result.stdout and secret not in result.stderr, secret
        for path in files:
            assert secret.encode() not in path.read_bytes(), (secret, path)


@pytest.fixture
def secret_mirror(arena: Arena, tls: tuple[Path, Path]) -> Iterator[MirrorServer]:
    """The good repository under /repo on an https mirror that is given credentials."""
    top = arena.base / "served"
    top.mkdir()
    shutil.copytree(arena.scene.repo, top / "repo")
    with MirrorServer(top, tls=tls) as server:
        yield server


def test_credentials_and_token_work_and_never_show(arena: Arena, tls: tuple[Path, Path],
                                                   secret_mirror: MirrorServer) -> None:
    mirror = secret_url(secret_mirror.url)
    common = ("--mirror", mirror, "--ca-bundle", str(tls[0]))
    installed = arena.run("install", *arena.args(*common))
    assert installed.code == 0, installed.stderr[-3000:]
    status = arena.run("status", *arena.args(*common))
    versions = arena.run("versions", *arena.args(*common))
    as_json = arena.run("versions", *arena.args(*common, "--output", "json"))
    assert versions.code == 0 and VERSION in versions.stdout, versions.stderr[-2000:]
    assert_no_secret(arena, installed, status, versions, as_json)
    assert (arena.install_dir / ".ready.json").is_file()
    seen = secret_mirror.requests_for("/repo/index.json")
    assert seen and all(r.query == f"token={TOKEN}" and r.authorization for r in seen)


@pytest.mark.parametrize("fault", ["tls", "404", "refused", "corrupt", "trickle"])
def test_failures_never_show_credentials_or_token(arena: Arena, tls: tuple[Path, Path],
                                                  secret_mirror: MirrorServer,
                                                  fault: str) -> None:
    extra: tuple[str, ...] = ("--ca-bundle", str(tls[0]), "--download-retries", "1")
    mirror = secret_url(secret_mirror.url)
    if fault == "tls":
        extra = ("--download-retries", "1")
    elif fault == "404":
        secret_mirror.fault("/repo/", Fault("status", status=404, times=0))
    elif fault == "refused":
        mirror = secret_url("https://127.0.0.1:9")
    elif fault == "corrupt":
        secret_mirror.fault(f"/repo/{LIB}", Fault("corrupt", after=10, times=0))
    else:
        secret_mirror.fault("/repo/index.json", Fault("trickle", after=2, seconds=0.5, times=0))
        extra = (*extra, "--read-timeout", "1")
    done = arena.run("install", *arena.args("--mirror", mirror, *extra))
    code = {"tls": 6, "404": 5, "refused": 6, "corrupt": 7, "trickle": 6}[fault]
    assert_refused(done, code)
    assert_no_secret(arena, done)
