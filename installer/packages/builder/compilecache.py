"""Compiled modules kept by what determines their bytes, so a build compiles only what changed.

A build farm rebuilds its repository when anything moves: a new kernel, a new driver, a fix
in how packages are written. Only the first two need make (minutes per kernel and flavour).
`package build --compile-cache DIR` keeps each compile's modules under a key made of what
shapes their bytes, and nothing else:

- the NVIDIA sources' sha256 and the flavour, the kernel headers' sha256s and release, the arch;
- the compiler as it answers `--version` (or the build root's distro, suite and compiler);
- the patches' sha256s, in order, and the modules asked for;
- the code that shapes the make run (`COMPILE_CODE`: the make command and its environment,
  how sources and headers are unpacked, the build root), by its bytes.

How packages are then written (manifest, signing, publishing) is not in the key: a change
there re-packages from the cache in seconds. Inputs without a digest (a sources or headers
directory) are never cached. An entry is written once, into a temp dir renamed into place,
and read back only when every module's sha256 still matches the entry's record (a damaged
one is compiled and written again).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from installer.packages.builder.inputs import file_sha256

COMPILE_CODE = ("compile.py", "headers.py", "rpmheaders.py", "nvsource.py", "buildroot.py")
RECORD = "compiled.json"
KEY_FORMAT = 1


@dataclass(frozen=True)
class CacheEntry:
    """A compile found in the cache: its modules (copied into the build) and its record."""

    modules: list[Path]
    record: dict[str, Any]


def code_digest(names: tuple[str, ...] = COMPILE_CODE, folder: Path | None = None) -> str:
    """sha256 over the named modules' bytes: the compile code as it runs now."""
    folder = folder or Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for name in names:
        digest.update(name.encode() + b"\0" + hashlib.sha256((folder / name).read_bytes())
                      .digest())
    return digest.hexdigest()


def compiler_identity(compiler: str, build_root: dict[str, Any] | None) -> str | None:
    """The compiler's first `--version` line (the build root's record where there is one);
    None where it does not answer, so the compile is not cached."""
    if build_root is not None:
        return json.dumps(build_root, sort_keys=True)
    try:
        done = subprocess.run([compiler, "--version"], capture_output=True, text=True,
                              timeout=30, check=False, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = done.stdout.splitlines()
    return lines[0].strip() if done.returncode == 0 and lines else None


def compile_key(parts: dict[str, Any]) -> str | None:
    """The key of a compile from what shapes its output, or None when an input has no digest
    (a directory) or the compiler did not answer."""
    headers = parts.get("headers") or []
    if not parts.get("source_sha256") or parts.get("compiler") is None or not headers or any(
            not header.get("sha256") for header in headers):
        return None
    document = {"format": KEY_FORMAT, "code": code_digest(), **parts}
    return hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()


def lookup(cache: Path, key: str, modules: list[str]) -> CacheEntry | None:
    """The entry for `key` when it is whole: its record readable and every module's bytes
    those it recorded; None otherwise (then the build compiles)."""
    entry = cache / key
    try:
        record = json.loads((entry / RECORD).read_text())
        recorded = record["modules"]
        files = [entry / f"{name}.ko" for name in modules]
        if sorted(recorded) != sorted(path.name for path in files):
            return None
        if any(file_sha256(path) != recorded[path.name] for path in files):
            return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return CacheEntry(files, record)


def store(cache: Path, key: str, modules: list[Path], record: dict[str, Any]) -> None:
    """Write the entry once: into a temp dir of the cache, renamed to its key; an entry
    already there (another build's) is left as it is."""
    cache.mkdir(parents=True, exist_ok=True)
    if (cache / key).exists():
        names = [path.name.removesuffix(".ko") for path in modules]
        if lookup(cache, key, names) is not None:
            return
        shutil.rmtree(cache / key)  # this cache's own entry, damaged: written again
    staging = Path(tempfile.mkdtemp(prefix=".tmp-", dir=cache))
    try:
        for path in modules:
            shutil.copyfile(path, staging / path.name)
        full = {**record, "modules": {p.name: file_sha256(staging / p.name) for p in modules}}
        (staging / RECORD).write_text(json.dumps(full, indent=1, sort_keys=True) + "\n")
        os.rename(staging, cache / key)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        if not (cache / key).is_dir():
            raise
