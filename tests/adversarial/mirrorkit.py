"""What the mirror cases share: a spoilable copy of the repository, a `fetch` run, and the
checks on what a fetch may change in the arena."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from e2e import INSTALL_DIR, KERNEL

from adversarial.harness import VERSION, WORK_AREA, Arena, Entry, Result, assert_refused

PKG = f"{KERNEL}/{VERSION}/proprietary"
LIB = f"{PKG}/lib64/libcuda.so.{VERSION}"
PARENTS = ("node/home", "node/home/kubernetes", "node/home/kubernetes/bin", f"node/{INSTALL_DIR}",
           f"node/{INSTALL_DIR}/.cache")
# the cache, the lock and the record of how the run ended (installdir/lastrun.py)
CACHE = (f"node/{INSTALL_DIR}/.cache/", f"node/{INSTALL_DIR}/.lock",
         f"node/{INSTALL_DIR}/.last-install.json")
# the simulated kernel's own state (FakeKernelHost keeps it in the tree), not the installer's
SIMULATED = ("node/proc/.fake-kernel.json", "node/proc/devices")


def copy_repo(arena: Arena, name: str) -> Path:
    """A copy of the good repository to spoil (inside the arena, before the snapshot)."""
    target = arena.base / name
    shutil.copytree(arena.scene.repo, target, symlinks=True)
    return target


def edit_manifest(repo: Path, change: Callable[[dict[str, Any]], Any]) -> None:
    """Change the manifest and make the index vouch for the result (so the manifest's own
    checks are what must catch it)."""
    path = repo / PKG / "manifest.json"
    doc = json.loads(path.read_text())
    change(doc)
    set_manifest_bytes(repo, json.dumps(doc).encode())


def set_manifest_bytes(repo: Path, data: bytes) -> None:
    (repo / PKG / "manifest.json").write_bytes(data)
    index = json.loads((repo / "index.json").read_text())
    for entry in index["packages"]:
        entry["manifest_sha256"] = hashlib.sha256(data).hexdigest()
    (repo / "index.json").write_text(json.dumps(index))


def add_file(doc: dict[str, Any], path: str, data: bytes) -> None:
    doc["files"].append({"path": path, "size": len(data), "kind": "config", "mode": 0o644,
                         "sha256": hashlib.sha256(data).hexdigest()})


def repo_listing(arena: Arena, name: str, path: str, data: bytes) -> Path:
    """A copy of the good repository (`copy_repo`) whose manifest also lists `path` with
    the size and digest of `data` (`add_file`), the index vouching for it."""
    repo = copy_repo(arena, name)
    edit_manifest(repo, lambda doc: add_file(doc, path, data))
    return repo


def fetch(arena: Arena, *mirrors: str, extra: tuple[str, ...] = (), timeout: float = 60
          ) -> Result:
    flags = [arg for mirror in mirrors for arg in ("--mirror", mirror)]
    return arena.run("fetch", *arena.args(*flags, "--download-retries", "2", *extra),
                     timeout=timeout)


def good(arena: Arena) -> str:
    return f"file://{arena.scene.repo}"


def assert_fetched(result: Result) -> None:
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.code == 0, result.stderr[-3000:]
    assert f"{VERSION}" in result.stdout


def assert_only(before: Mapping[str, Entry], after: Mapping[str, Entry],
                prefixes: tuple[str, ...] = WORK_AREA) -> None:
    """Nothing changed in the arena but the install dir's parents (created empty), the
    given prefixes and the work dir."""
    changed = {p for p in before.keys() | after.keys() if before.get(p) != after.get(p)}
    stray = {p for p in changed if p not in (*PARENTS, *SIMULATED) and not p.startswith("work/")
             and not any(p == x.rstrip("/") or p.startswith(x) for x in prefixes)}
    assert not stray, {p: (before.get(p), after.get(p)) for p in sorted(stray)}


def warned(result: Result, source_part: str) -> bool:
    """A log event says that a source (its name containing `source_part`) failed."""
    kinds = ("source unavailable", "source failed", "file failed on mirror")
    return any(event.get("event") in kinds and source_part in json.dumps(event)
               for event in result.events)


def fetch_refused(arena: Arena, mirrors: Sequence[str], code: int, *causes: str,
                  extra: tuple[str, ...] = (), prefixes: tuple[str, ...] = WORK_AREA) -> Result:
    """A fetch from `mirrors` is refused (the code, one line naming every cause) and changes
    nothing in the arena but what `assert_only` allows; returns its result."""
    before = arena.snapshot()
    done = fetch(arena, *mirrors, extra=extra)
    assert_refused(done, code, *causes)
    assert_only(before, arena.snapshot(), prefixes)
    return done


def fetch_ok(arena: Arena, mirrors: Sequence[str], extra: tuple[str, ...] = ()) -> Result:
    """A fetch from `mirrors` succeeds and changes nothing in the arena but the cache (and
    what `assert_only` always allows); returns its result."""
    before = arena.snapshot()
    done = fetch(arena, *mirrors, extra=extra)
    assert_fetched(done)
    assert_only(before, arena.snapshot(), CACHE)
    return done
