"""RHEL-family shapes built with the real tools: `kernel-devel` RPMs made by `rpmbuild`, a
dnf repository made by `createrepo_c`, its `repomd.xml` signed by `gpg --detach-sign
--armor` with a throw-away key (what `repo_gpgcheck` verifies).

`rhel_tree` lays a Debian kernel's real headers (the kernel tier's bookworm .debs: the
arch package, its -common tree and linux-kbuild's built scripts) out as RHEL's
kernel-devel does: one complete tree at `/usr/src/kernels/<release>/` (srctree and objtree
in one, the full top-level Makefile, `scripts/` with its tools), renamed to a RHEL-style
release (`UTS_RELEASE`, `.kernelvariables`). Modules compile against it as against
kernel-devel. `minimal_tree` is `nvsources.fake_kbuild` at that path: fast, still a real
package of the real format.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from nvsources import fake_kbuild

SPEC = """\
Name: {name}
Version: {version}
Release: {release}
Summary: kernel-devel-shaped test package
License: GPL-2.0-only
AutoReqProv: no
%description
The build tree of a test kernel, laid out as RHEL's kernel-devel.
%install
cp -a {tree}/. %{{buildroot}}/
%files
{files}
"""


def rpm_tools() -> bool:
    """Whether this machine has the tools the RPM tests use (`make deps`)."""
    return all(shutil.which(tool) for tool in ("rpmbuild", "rpm2archive", "createrepo_c",
                                               "gpg", "gpgv"))


def rhel_tree(debs_root: Path, deb_release: str, dest: Path, release: str) -> Path:
    """`dest/usr/src/kernels/<release>/` from the Debian headers unpacked at `debs_root`."""
    abi = deb_release.rsplit("-", 1)[0]
    kbuild = next((debs_root / "usr" / "lib").glob("linux-kbuild-*"))
    tree = dest / "usr" / "src" / "kernels" / release
    tree.parent.mkdir(parents=True)
    shutil.copytree(debs_root / "usr" / "src" / f"linux-headers-{abi}-common", tree,
                    symlinks=True)
    for name in ("scripts", "tools"):  # links into linux-kbuild: the built tools, copied
        (tree / name).unlink()
        shutil.copytree(kbuild / name, tree / name, symlinks=True)
    arch_tree = debs_root / "usr" / "src" / f"linux-headers-{deb_release}"
    for item in arch_tree.iterdir():
        if item.name in ("scripts", "tools", "Makefile"):  # the -common Makefile is the full one
            continue
        if item.is_dir():
            shutil.copytree(item, tree / item.name, symlinks=True, dirs_exist_ok=True)
        else:
            shutil.copy2(item, tree / item.name)
    for name in (".kernelvariables", "include/generated/utsrelease.h"):
        path = tree / name
        path.write_text(path.read_text().replace(deb_release, release))
    return dest


def minimal_tree(dest: Path, release: str) -> Path:
    """`dest/usr/src/kernels/<release>/` as `fake_kbuild`: compiles in milliseconds."""
    fake_kbuild(dest / "usr" / "src" / "kernels" / release, release)
    return dest


def build_rpm(tree_root: Path, out: Path, *, name: str = "kernel-devel", version: str,
              release: str, arch: str = "x86_64", payload: str = "w1.zstdio",
              files: str = "/usr/src/kernels") -> Path:
    """`tree_root` packed by the real `rpmbuild` (a minimal spec: %install copies it)."""
    top = out / f".rpmbuild-{name}-{version}-{release}"
    spec = top / "package.spec"
    spec.parent.mkdir(parents=True)
    spec.write_text(SPEC.format(name=name, version=version, release=release,
                                tree=tree_root, files=files))
    subprocess.run(["rpmbuild", "-bb", "--target", arch, "--define", f"_topdir {top}",
                    "--define", f"_binary_payload {payload}",
                    "--define", "__os_install_post %{nil}", "--define", "debug_package %{nil}",
                    "--define", "_build_id_links none", str(spec)],
                   check=True, capture_output=True, timeout=300)
    built = next((top / "RPMS").glob(f"*/{name}-{version}-{release}.*.rpm"))
    target = out / built.name
    built.rename(target)
    shutil.rmtree(top)
    return target


def gpg(home: Path, *args: str, stdin: bytes | None = None) -> bytes:
    return subprocess.run(["gpg", "--batch", "--homedir", str(home), *args], input=stdin,
                          check=True, capture_output=True, timeout=60).stdout


def make_key(home: Path, name: str) -> tuple[Path, Path]:
    """A throw-away signing key: (its public key armored, as distributions ship it; binary)."""
    home.mkdir(mode=0o700, parents=True)
    gpg(home, "--passphrase", "", "--quick-gen-key", f"{name} <{name}@example.invalid>",
        "ed25519", "sign", "never")
    armored = home.parent / f"RPM-GPG-KEY-{name}"
    armored.write_bytes(gpg(home, "--armor", "--export"))
    binary = home.parent / f"{name}.gpg"
    binary.write_bytes(gpg(home, "--export"))
    return armored, binary


def make_repo(root: Path, rpms: list[Path], *, compress: str = "gz",
              checksum: str = "sha256") -> Path:
    """`root/Packages/` holding `rpms`, `root/repodata/` made by the real createrepo_c."""
    packages = root / "Packages"
    packages.mkdir(parents=True, exist_ok=True)
    for rpm in rpms:
        shutil.copy2(rpm, packages / rpm.name)
    subprocess.run(["createrepo_c", "--general-compress-type", compress, "--checksum",
                    checksum, "--no-database", str(root)], check=True, capture_output=True,
                   timeout=120)
    return root


def sign_repomd(root: Path, home: Path) -> Path:
    """`repodata/repomd.xml.asc`: the detached armored signature dnf's repo_gpgcheck reads."""
    repomd = root / "repodata" / "repomd.xml"
    signature = repomd.with_name("repomd.xml.asc")
    signature.unlink(missing_ok=True)
    gpg(home, "--detach-sign", "--armor", "--output", str(signature), str(repomd))
    return signature


def stop_agents(base: Path) -> None:
    """gpg starts an agent per home directory: end those under `base`."""
    for home in base.glob("**/*gnupg"):
        subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "gpg-agent"],
                       check=False, capture_output=True, timeout=30)
