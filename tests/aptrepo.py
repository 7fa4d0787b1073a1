"""Apt archives for tests, made with the real tools: .debs by `dpkg-deb`, `Packages.xz`
indexes with their sizes and SHA256, a `Release` per suite clear-signed by the real `gpg`
with a throw-away key into `InRelease` (verified by the product with the real `gpgv`).

    gnupg, keyring = tmp / "gnupg", key(tmp / "gnupg", "archive")
    deb = build_deb(tree, "linux-headers-6.1.0-57-gcp", "6.1.0-57.10", pool, "Depends: ...\\n")
    publish(root, "jammy-updates", {"main": [(deb, "Depends: ...\\n")]}, gnupg)

`ubuntu_headers` lays real Debian headers out the way Ubuntu's kernel packaging does, for
one flavour and its common package (see its docstring for the sources it follows).
"""

from __future__ import annotations

import hashlib
import lzma
import os
import re
import shutil
import subprocess
from pathlib import Path


def refused(done: subprocess.CompletedProcess[str], code: int = 7) -> str:
    """The one `error(...)` line of a refused `package build`, with its exit code."""
    assert done.returncode == code, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error(")]
    assert len(errors) == 1, done.stderr[-3000:]
    return errors[0]


def build_deb(tree: Path, name: str, version: str, pool: Path, fields: str = "", *,
              compression: str = "xz", arch: str = "amd64") -> Path:
    """`tree` (the package's files) packed by dpkg-deb with `-Z<compression>`."""
    (tree / "DEBIAN").mkdir(parents=True, exist_ok=True)
    (tree / "DEBIAN" / "control").write_text(
        f"Package: {name}\nVersion: {version}\nArchitecture: {arch}\n"
        f"Maintainer: tests <tests@example.invalid>\n{fields}Description: test\n")
    pool.mkdir(parents=True, exist_ok=True)
    target = pool / f"{name}_{version}_{arch}.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", f"-Z{compression}", "-z1", "--build",
                    str(tree), str(target)], check=True, capture_output=True)
    return target


def stanza(deb: Path, root: Path, fields: str = "") -> str:
    """The deb's paragraph of a Packages index (what apt reads: Filename, Size, SHA256)."""
    name, version, arch = deb.stem.split("_")
    return (f"Package: {name}\nVersion: {version}\nArchitecture: {arch}\n{fields}"
            f"Filename: {deb.relative_to(root).as_posix()}\nSize: {deb.stat().st_size}\n"
            f"SHA256: {file_sha256(deb)}\nDescription: test\n")


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def gpg(gnupg: Path, *args: str, stdin: bytes | None = None) -> bytes:
    return subprocess.run(["gpg", "--batch", "--homedir", str(gnupg), *args], input=stdin,
                          check=True, capture_output=True).stdout


def key(gnupg: Path, name: str) -> Path:
    """A new ed25519 signing key in `gnupg`; its public keyring file (what gpgv reads)."""
    gnupg.mkdir(mode=0o700, parents=True)
    gpg(gnupg, "--passphrase", "", "--quick-gen-key", f"{name} <{name}@example.invalid>",
        "ed25519", "sign", "never")
    keyring = gnupg.parent / f"{name}.gpg"
    keyring.write_bytes(gpg(gnupg, "--export"))
    return keyring


def publish(root: Path, suite: str, components: dict[str, list[tuple[Path, str]]],
            gnupg: Path, *, origin: str = "Ubuntu") -> None:
    """The suite's Packages.xz per component (each .deb with its fields) and its InRelease."""
    dists = root / "dists" / suite
    for component, debs in components.items():
        index = dists / component / "binary-amd64"
        index.mkdir(parents=True, exist_ok=True)
        text = "\n".join(stanza(deb, root, fields) for deb, fields in debs)
        (index / "Packages.xz").write_bytes(lzma.compress(text.encode()))
    sign_release(root, suite, gnupg, origin=origin)


def sign_release(root: Path, suite: str, gnupg: Path, *, origin: str = "Ubuntu") -> None:
    """Release (SHA256 of each Packages index, as it is now) clear-signed into InRelease."""
    dists = root / "dists" / suite
    lines = "".join(f" {file_sha256(p)} {p.stat().st_size} {p.relative_to(dists).as_posix()}\n"
                    for p in sorted(dists.glob("*/binary-amd64/Packages*")))
    release = (f"Origin: {origin}\nLabel: {origin}\nSuite: {suite}\n"
               f"Codename: {suite.split('-')[0]}\nArchitectures: amd64\n"
               f"Components: main restricted universe multiverse\nSHA256:\n{lines}")
    (dists / "InRelease").write_bytes(gpg(gnupg, "--clearsign", "--output", "-",
                                          stdin=release.encode()))


def ubuntu_headers(debian: Path, release: str, flavour_release: str, common: str,
                   out: Path) -> tuple[Path, Path]:
    """Debian's unpacked headers of `release` (arch tree, -common, linux-kbuild under
    `debian`) laid out as Ubuntu ships a flavour's headers: (flavour tree, common tree),
    each the root of a package, for `flavour_release` and the common package `common`.

    Ubuntu's kernel packaging (torvalds/linux as mirrored with Ubuntu's packaging,
    debian/rules.d/2-binary-arch.mk @ 0fa05ca68c7319e8501865a840e7c03e8339feb0, "The
    flavour specific headers image"): the flavour's directory
    /usr/src/linux-headers-<abi>-<flavour> holds what `make O=$(hdrdir) prepare scripts`
    made (.config, include/generated, include/config, arch/<arch>/include/generated, the
    built scripts/, tools/objtool), Module.symvers, and its Makefile is removed; then
    debian/scripts/link-headers @ 4e9a16c3b6c6e6a3ea0a9f581d6407654fbedc88 links every
    Makefile*, Kconfig*, Kbuild*, *.sh, *.pl, *.lds, every file under include/ and scripts/
    and each include/* directory it lacks to ../<indep headers package>/<path>, at the
    highest missing directory. The indep package is `$(src_pkg_name)-headers-$(abi_release)`
    (debian/rules.d/0-common-vars.mk: `indep_hdrs_pkg_name`), the flavour's package depends
    on it (debian.master/control.d/flavour-control.stub @
    6d076cb958f562cdf07727a58b6545c96ccfcfcc: `SRCPKGNAME-headers-PKGVER-ABINUM`). The
    release the tree says (utsrelease.h, include/config/kernel.release) is rewritten to
    `flavour_release`; nothing else of Debian's bytes changes.
    """
    src = debian / "usr" / "src"
    kbuild = next((debian / "usr" / "lib").glob("linux-kbuild-*"))
    common_root, flavour_root = out / "common", out / "flavour"
    common_dir = common_root / "usr" / "src" / common
    flavour_dir = flavour_root / "usr" / "src" / f"linux-headers-{flavour_release}"
    abi = release.rsplit("-", 1)[0]
    shutil.copytree(src / f"linux-headers-{abi}-common", common_dir, symlinks=True)
    for link in ("scripts", "tools"):  # Debian's links into linux-kbuild: Ubuntu has none
        (common_dir / link).unlink()
    shutil.copytree(src / f"linux-headers-{release}", flavour_dir, symlinks=True,
                    ignore=shutil.ignore_patterns("Makefile", ".kernelvariables", "scripts",
                                                  "tools"))
    shutil.copytree(kbuild / "scripts", flavour_dir / "scripts")
    shutil.copytree(kbuild / "tools", flavour_dir / "tools")
    for name in ("include/generated/utsrelease.h", "include/config/kernel.release"):
        path = flavour_dir / name
        path.write_text(path.read_text().replace(release, flavour_release))
    _link_headers(flavour_dir, common_dir, common)
    return flavour_root, common_root


_LINKED = re.compile(r"^(Makefile|Kconfig|Kbuild).*|.*\.(sh|pl|lds)$")


def _link_headers(hdrdir: Path, common: Path, symdir: str) -> None:
    """debian/scripts/link-headers, in Python (see `ubuntu_headers`)."""
    items = [p for p in common.rglob("*") if p.is_file() and not p.is_symlink()
             and _LINKED.match(p.name)]
    items += [p for top in ("include", "scripts") if (common / top).is_dir()
              for p in (common / top).rglob("*") if p.is_file()]
    items += [p for p in (common / "include").iterdir() if p.is_dir()]
    for item in sorted(items):
        relative = item.relative_to(common)
        if os.path.lexists(hdrdir / relative):
            continue
        last = relative
        while not os.path.lexists(hdrdir / last.parent) and last.parent != Path("."):
            last = last.parent
        if (hdrdir / last.parent).is_symlink():
            continue
        up = "../" * len(last.parts)
        (hdrdir / last).symlink_to(f"{up}{symdir}/{last.as_posix()}")
