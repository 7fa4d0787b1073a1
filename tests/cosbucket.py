"""Google's Container-Optimized OS GPU driver buckets, reproduced on disk and served locally.

What cos-tools' `cos_gpu_installer` reads (src/pkg/cos/artifacts.go, extensions.go), laid
out under one served directory:

    cos-tools/<BUILD_ID>/[<board>/]              (<board>/ only on current builds)
        gpu_<alias>_version                      "535.261.03\\n" (one alias padded with
                                                 extra trailing whitespace)
        nvidia-drivers-<v>.tgz                   prebuilt *signed* open modules + GSP firmware
        kernel-headers.tgz, toolchain_env        placeholders (nothing reads them)
        extensions/gpu/NVIDIA-Linux-x86_64-<v>-custom.run           placeholder
        extensions/gpu/nvidia-drivers-<v>-signature.tar.gz          <module>.ko.sig tails
    nvidia-drivers-us-public/tesla/<v>/NVIDIA-Linux-x86_64-<v>.run  a real makeself archive

`nvidia-drivers-<v>.tgz` is what GNU tar `--xattrs -czf` writes: members
`drivers/{nvidia,nvidia-uvm,nvidia-modeset,nvidia-drm}.ko`, each ending with a real appended
module signature (module ‖ DER PKCS#7 ‖ struct module_signature ‖ marker, made by the real
`openssl cms -sign` with a throw-away key, what the kernel's sign-file appends), and
`firmware/nvidia/<v>/gsp_{ga10x,tu10x}.bin`, each with the PAX record
`SCHILY.xattr.security.ima` holding raw binary bytes (an IMA v2 signature blob, see
`ima_xattr`). Python's tarfile reads that record as a str: bytes come back with
`value.encode("utf-8", "surrogateescape")`.

The runfile holds NVIDIA's internal layout at its root: the real user-mode libraries from
Debian's 535 packages (tests/artifacts.py) as regular files `lib*.so.<v>` (no links, as
NVIDIA ships them), `nvidia-smi`, `nvidia-installer` (a script that must never run),
`.manifest` (second line: the version), `kernel/` and `kernel-open/` (small sources) and
`firmware/gsp_*.bin` (the tgz's firmware bytes). It is cached under `artifacts.cache_root()`
keyed by its inputs' bytes (tests/cosrunfile.py).

`cosserver.CosServer` serves such a directory over HTTPS or HTTP with Cloud Storage's
`x-goog-hash` headers (tests/cosserver.py).

    bucket = make_bucket(tmp_path)
    with CosServer(bucket.root) as server:
        requests.get(server.cos_tools_url + "/17162.279.34/lakitu/gpu_default_version",
                     verify=str(server.ca_bundle))
"""

from __future__ import annotations

import gzip
import hashlib
import io
import shutil
import subprocess
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cosrunfile import cached_runfile, runfile_name

from installer.packages.builder.modsig import MARKER, make_tail, strip_signature
from installer.testing import SAMPLE_NODES, NodeSpec, build_node
from installer.testing.kernel import elf_with_modinfo, write_host_module

DEFAULT_BUILD = "17162.279.34"
DEFAULT_BOARD = "lakitu"
DEFAULT_VERSION = "535.261.03"
DEFAULT_KERNEL = "6.1.58+"  # the gke-cos-a100x8 sample node's kernel
COS_TOOLS = "cos-tools"
RUNFILE_BUCKET = "nvidia-drivers-us-public"
# file stem: depends, as NVIDIA's open modules declare them
MODULES: dict[str, str] = {
    "nvidia": "",
    "nvidia-uvm": "nvidia",
    "nvidia-modeset": "nvidia",
    "nvidia-drm": "nvidia-modeset,drm_kms_helper,drm",
}
OPEN_LICENCE = "Dual MIT/GPL"
FIRMWARE = ("gsp_ga10x.bin", "gsp_tu10x.bin")
IMA_XATTR = "SCHILY.xattr.security.ima"
PADDED_ALIAS = "R535"  # its version file carries extra trailing whitespace
PADDING = " \t\n\n"
TAR_MTIME = 1_717_000_000
RUN_LIBS = ("libcuda.so", "libnvidia-ml.so", "libnvidia-ptxjitcompiler.so",
            "libnvidia-nvvm.so")


# ------------------------------------------------------------------ the bucket on disk


@dataclass
class CosBucket:
    """One COS build's GPU artifacts (and NVIDIA's runfile) under `root`."""

    root: Path  # served directory (contains cos-tools/ and nvidia-drivers-us-public/)
    build_id: str
    board: str | None
    version: str
    kernel_release: str
    cert: Path  # the test signing certificate (PEM) the modules are signed with
    key: Path  # its private key (PEM)
    aliases: dict[str, str] = field(default_factory=dict)
    unsigned: dict[str, bytes] = field(default_factory=dict)  # "nvidia.ko": module bytes
    signed: dict[str, bytes] = field(default_factory=dict)  # what the tgz holds
    firmware: dict[str, bytes] = field(default_factory=dict)  # "gsp_ga10x.bin": bytes
    ima: dict[str, bytes] = field(default_factory=dict)  # tgz member: security.ima value
    runfile: Path | None = None

    def prefix(self) -> Path:
        """root/cos-tools/<build>/[<board>/]"""
        base = self.root / COS_TOOLS / self.build_id
        return base / self.board if self.board else base

    def prefix_path(self) -> str:
        """The URL path of the prefix: /cos-tools/<build>[/<board>]"""
        return "/" + self.prefix().relative_to(self.root).as_posix()

    def path(self, name: str) -> str:
        """The URL path of an object under the prefix (`gpu_default_version`, ...)."""
        return f"{self.prefix_path()}/{name}"

    @property
    def tarball(self) -> Path:
        return self.prefix() / tarball_name(self.version)

    @property
    def tarball_path(self) -> str:
        return self.path(tarball_name(self.version))

    @property
    def runfile_path(self) -> str:
        """/nvidia-drivers-us-public/tesla/<v>/NVIDIA-Linux-x86_64-<v>.run"""
        return f"/{RUNFILE_BUCKET}/tesla/{self.version}/{runfile_name(self.version)}"

    def version_file(self, alias: str) -> Path:
        return self.prefix() / f"gpu_{alias}_version"

    def write_alias(self, alias: str, version: str, *, text: str | None = None) -> Path:
        """(Re)point `gpu_<alias>_version` at `version` (a version with no tarball is fine:
        the "alias points nowhere" fault); `text` overrides the exact file content."""
        path = self.version_file(alias)
        path.write_text(text if text is not None else version + "\n")
        self.aliases[alias] = version
        return path

    def remove_alias(self, alias: str) -> None:
        self.version_file(alias).unlink()
        self.aliases.pop(alias, None)


def tarball_name(version: str) -> str:
    return f"nvidia-drivers-{version}.tgz"


def firmware_bytes(version: str, name: str) -> bytes:
    """Deterministic stand-in GSP firmware (8 KiB, an ELF-like start)."""
    seed = hashlib.sha256(f"{version}/{name}".encode()).digest()
    return b"\x7fELF\x02\x01\x01\0" + seed * 256


def ima_xattr(data: bytes) -> bytes:
    """An IMA v2 signature xattr value for `data` (deterministic, not a real signature):
    type 0x03 (EVM_IMA_XATTR_DIGSIG), version 2, hash algo 4 (sha256), a 4-byte key id,
    a big-endian 2-byte length and the "signature" bytes."""
    digest = hashlib.sha256(data).digest()
    sig = hashlib.sha512(b"ima" + digest).digest() * 4  # 256 bytes, like RSA-2048
    return b"\x03\x02\x04" + digest[:4] + len(sig).to_bytes(2, "big") + sig


def module_bytes(stem: str, *, version: str, kernel_release: str,
                 depends: str | None = None, licence: str = OPEN_LICENCE) -> bytes:
    """A minimal ELF64 x86_64 relocatable object whose `.modinfo` says what NVIDIA's open
    module `stem` says (what kmod's modinfo and the product's reader take)."""
    fields = [f"version={version}", f"license={licence}",
              f"depends={MODULES.get(stem, '') if depends is None else depends}",
              "retpoline=Y", f"name={stem.replace('-', '_')}",
              f"vermagic={kernel_release} SMP preempt mod_unload modversions "]
    return elf_with_modinfo(fields)


def make_key(directory: Path) -> tuple[Path, Path]:
    """A throw-away RSA-2048 code-signing key and certificate (the real openssl)."""
    directory.mkdir(parents=True, exist_ok=True)
    key, cert = directory / "cos-signing.key", directory / "cos-signing.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-noenc", "-keyout",
                    str(key), "-out", str(cert), "-days", "2", "-subj",
                    "/O=gpu-node-installer tests/CN=cos test module signing key",
                    "-addext", "extendedKeyUsage=codeSigning"],
                   check=True, capture_output=True)
    return key, cert


def sign_module(module: bytes, key: Path, cert: Path, work: Path) -> bytes:
    """module ‖ tail, the tail made as the kernel's sign-file makes it (detached CMS, no
    certificates, no attributes, sha256, signer by issuer and serial) by the real openssl."""
    work.mkdir(parents=True, exist_ok=True)
    src, der = work / "module.ko", work / "sig.der"
    src.write_bytes(module)
    subprocess.run(["openssl", "cms", "-sign", "-binary", "-noattr", "-nocerts", "-md",
                    "sha256", "-outform", "DER", "-signer", str(cert), "-inkey", str(key),
                    "-in", str(src), "-out", str(der)], check=True, capture_output=True)
    tail = make_tail(der.read_bytes())
    src.unlink()
    der.unlink()
    return module + tail


class _GnuPaxInfo(tarfile.TarInfo):
    """Extended headers as GNU tar --xattrs writes them: values raw (binary xattrs without
    the `hdrcharset=BINARY` record Python would add), named `<dir>/PaxHeaders/<file>`."""

    def _create_pax_generic_header(self, pax_headers: dict[str, str], type: bytes,
                                   encoding: str) -> bytes:
        records = b""
        for keyword, value in pax_headers.items():
            key, raw = keyword.encode("utf-8"), value.encode("utf-8", "surrogateescape")
            length = len(key) + len(raw) + 3
            n = p = 0
            while True:
                n = length + len(str(p))
                if n == p:
                    break
                p = n
            records += str(p).encode() + b" " + key + b"=" + raw + b"\n"
        head, _, tail = self.name.rstrip("/").rpartition("/")
        name = f"{head}/PaxHeaders/{tail}" if head else f"PaxHeaders/{tail}"
        info = {"name": name[:100], "type": type, "size": len(records),
                "magic": tarfile.POSIX_MAGIC}
        return (self._create_header(info, tarfile.USTAR_FORMAT, "ascii", "replace")
                + self._create_payload(records))


def write_tgz(path: Path, members: list[tuple[str, bytes | None, dict[str, bytes]]]) -> None:
    """A deterministic pax .tgz: (name, data or None for a directory, xattrs) in order."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT,
                      tarinfo=_GnuPaxInfo) as tar:
        for name, data, xattrs in members:
            info = _GnuPaxInfo(name)
            info.mtime, info.uid, info.gid, info.uname, info.gname = (
                TAR_MTIME, 0, 0, "root", "root")
            if data is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
            else:
                info.size, info.mode = len(data), 0o644
            info.pax_headers = {f"SCHILY.xattr.{k}": v.decode("utf-8", "surrogateescape")
                                for k, v in xattrs.items()}
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0,
                                               filename="") as gz:
        gz.write(buffer.getvalue())


def _tree_members(files: dict[str, bytes]) -> list[tuple[str, bytes | None, dict[str, bytes]]]:
    """Directories first, as tar walks them, then each directory's files, sorted."""
    out: list[tuple[str, bytes | None, dict[str, bytes]]] = []
    seen: set[str] = set()
    for name in sorted(files):
        parts = name.split("/")[:-1]
        for depth in range(1, len(parts) + 1):
            directory = "/".join(parts[:depth])
            if directory not in seen:
                seen.add(directory)
                out.append((directory, None, {}))
        out.append((name, files[name], {}))
    return out


def make_bucket(base: Path, *, build_id: str = DEFAULT_BUILD,
                board: str | None = DEFAULT_BOARD, version: str = DEFAULT_VERSION,
                kernel_release: str = DEFAULT_KERNEL, aliases: dict[str, str] | None = None,
                modules_dir: Path | None = None, standins: Path | None = None,
                xz: bool = False, runfile: bool = True) -> CosBucket:
    """Lay out one COS build's GPU artifacts under `base/bucket` (keys in `base/keys`).

    `modules_dir`: .ko files to sign and pack (an already signed one is re-signed); by
    default small stand-in open modules with vermagic for `kernel_release`. `standins`:
    a `native.build_standins()` directory whose libnvidia-ml.so.1/libcuda.so.1 replace the
    runfile's real libnvidia-ml.so.<v>/libcuda.so.<v>. `xz`: makeself --xz instead of gzip.
    `runfile=False` leaves NVIDIA's runfile out (fast, for tests that do not read it).
    """
    root = base / "bucket"
    key, cert = make_key(base / "keys")
    bucket = CosBucket(root, build_id, board, version, kernel_release, cert, key)
    prefix = bucket.prefix()
    prefix.mkdir(parents=True)
    for alias, target in (aliases or {"default": version, "latest": version,
                                      PADDED_ALIAS: version}).items():
        bucket.write_alias(alias, target,
                           text=target + PADDING if alias == PADDED_ALIAS else None)

    if modules_dir is not None:
        sources = {p.name: strip_signature(p.read_bytes())[0]
                   for p in sorted(modules_dir.glob("*.ko"))}
        if not sources:
            raise ValueError(f"no .ko files in {modules_dir}")
    else:
        sources = {f"{stem}.ko": module_bytes(stem, version=version,
                                              kernel_release=kernel_release)
                   for stem in MODULES}
    work = base / "signing"
    for name, data in sources.items():
        bucket.unsigned[name] = data
        bucket.signed[name] = sign_module(data, key, cert, work)
    shutil.rmtree(work)
    bucket.firmware = {name: firmware_bytes(version, name) for name in FIRMWARE}

    members: list[tuple[str, bytes | None, dict[str, bytes]]] = [("drivers", None, {})]
    members += [(f"drivers/{name}", data, {}) for name, data in sorted(bucket.signed.items())]
    members += [("firmware", None, {}), ("firmware/nvidia", None, {}),
                (f"firmware/nvidia/{version}", None, {})]
    for name, data in sorted(bucket.firmware.items()):
        member = f"firmware/nvidia/{version}/{name}"
        bucket.ima[member] = ima_xattr(data)
        members.append((member, data, {"security.ima": bucket.ima[member]}))
    write_tgz(bucket.tarball, members)

    write_tgz(prefix / "kernel-headers.tgz", _tree_members({
        f"usr/src/linux-headers-{kernel_release}/Makefile": b"# placeholder\n"}))
    (prefix / "toolchain_env").write_text(
        "CC=x86_64-cros-linux-gnu-clang\nCXX=x86_64-cros-linux-gnu-clang++\n")
    gpu = prefix / "extensions" / "gpu"
    gpu.mkdir(parents=True)
    (gpu / f"NVIDIA-Linux-x86_64-{version}-custom.run").write_text(
        "#!/bin/sh\necho 'placeholder: COS custom runfile, never run by tests' >&2\nexit 1\n")
    sigs = {f"{name}.sig": strip_signature(data)[1] for name, data in bucket.signed.items()}
    write_tgz(gpu / f"nvidia-drivers-{version}-signature.tar.gz", _tree_members(sigs))

    if runfile:
        target = root / RUNFILE_BUCKET / "tesla" / version / runfile_name(version)
        target.parent.mkdir(parents=True)
        _copy_runfile(cached_runfile(version, bucket.firmware, standins=standins, xz=xz),
                      target)
        bucket.runfile = target
    return bucket


def _copy_runfile(source: Path, target: Path) -> None:
    """A copy, never a hard link: a test that truncates or corrupts the bucket's runfile
    must not reach the cache (copying 50 MB costs well under a second)."""
    shutil.copyfile(source, target)
    target.chmod(0o755)


def read_tgz(path: Path) -> dict[str, tuple[tarfile.TarInfo, bytes | None]]:
    """Every member of a .tgz with its bytes (None for non-files), for assertions."""
    out: dict[str, tuple[tarfile.TarInfo, bytes | None]] = {}
    with tarfile.open(path, "r:gz") as tar:
        for info in tar.getmembers():
            handle = tar.extractfile(info) if info.isfile() else None
            out[info.name] = (info, handle.read() if handle else None)
    return out


def xattr_bytes(info: tarfile.TarInfo, name: str = "security.ima") -> bytes | None:
    """A member's SCHILY.xattr.<name> as the raw bytes GNU tar stored."""
    value: Any = info.pax_headers.get(f"SCHILY.xattr.{name}")
    return value.encode("utf-8", "surrogateescape") if value is not None else None


__all__ = ["FIRMWARE", "IMA_XATTR", "MARKER", "MODULES", "CosBucket", "cos_node",
           "firmware_bytes", "ima_xattr", "make_bucket", "module_bytes", "read_tgz",
           "tarball_name", "xattr_bytes"]


# ------------------------------------------------------------------ a COS node


def cos_node(root: Path, spec: NodeSpec | None = None) -> Path:
    """A COS node tree (default: the gke-cos-a100x8 sample) with its kernel's own drm and
    drm_kms_helper in /lib/modules (nvidia-drm needs them, as on a real COS image)."""
    spec = spec or SAMPLE_NODES["gke-cos-a100x8"]
    root.mkdir(parents=True)
    build_node(root, spec)
    tree = root / "lib" / "modules" / spec.kernel
    drm, helper = "kernel/drivers/gpu/drm/drm.ko", "kernel/drivers/gpu/drm/drm_kms_helper.ko"
    write_host_module(tree, drm, "drm")
    write_host_module(tree, helper, "drm_kms_helper", ["drm"])
    (tree / "modules.dep").write_text(f"{drm}:\n{helper}: {drm}\n")
    return root
