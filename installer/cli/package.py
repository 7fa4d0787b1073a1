"""`gpu-node-installer package ...`: make driver packages (from .debs/.run, or compiled).

The flags map one to one onto `installer.packages.builder.BuildRequest`; the work and every
refusal live there.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import click

from installer.cli import logs
from installer.cli.commands import emit, output_option
from installer.node import arches


@click.group()
def package() -> None:
    """Make driver packages (see docs/package-format.md)."""


_IN_FILE = click.Path(exists=True, dir_okay=False, path_type=Path)
_IN_DIR = click.Path(exists=True, file_okay=False, path_type=Path)
_OUT = click.Path(path_type=Path)


@package.command(name="build")
@click.option("--deb", "debs", multiple=True, type=_IN_FILE,
              help="a Debian NVIDIA package (.deb), repeatable")
@click.option("--tree", "trees", multiple=True, type=_IN_DIR,
              help="a tree the .debs were extracted into (dpkg-deb -x), repeatable")
@click.option("--run", "run_files", multiple=True, type=_IN_FILE,
              help="NVIDIA's .run installer (makeself), repeatable")
@click.option("--modules", "modules_dir", type=_IN_DIR,
              help="directory of kernel modules built for one kernel release")
@click.option("--ubuntu-modules", "ubuntu_modules", multiple=True, type=_IN_FILE,
              metavar="DEB",
              help="Canonical's signed NVIDIA modules for an Ubuntu kernel: its "
                   "linux-modules-nvidia-<branch>[-server]-open-<kernel> .deb, taken as "
                   "signed (each must carry a signature; with --sign-cert verified against "
                   "it); repeatable")
@click.option("--ubuntu-modules-from-apt", "ubuntu_from_apt", metavar="BRANCH[-server]",
              help="like --ubuntu-modules, downloaded for --kernel-release from the Ubuntu "
                   "archive's restricted component (--apt-mirror [default: Ubuntu's], "
                   "--apt-suite: jammy reads its -updates and -security too, --apt-keyring "
                   "[default: Ubuntu's]), verified by its signed InRelease, with "
                   "libnvidia-compute, nvidia-utils and nvidia-firmware of the modules' "
                   "driver version")
@click.option("--nvidia-source", "nvidia_sources", multiple=True,
              type=click.Path(exists=True, path_type=Path),
              help="compile the modules from NVIDIA's sources: nvidia-kernel-source or "
                   "nvidia-open-kernel-source .deb, NVIDIA's .run, a tarball or directory; "
                   "repeatable (one version; e.g. both Debian packages for --flavour both); "
                   "without --kernel-headers: a source package (built on nodes later)")
@click.option("--kernel-headers", "kernel_headers", multiple=True,
              type=click.Path(exists=True, path_type=Path),
              help="with --nvidia-source: linux-headers .debs (with their -common and "
                   "linux-kbuild .debs), a kernel-devel .rpm, a tarball or a build "
                   "directory; repeatable, and "
                   "headers of several releases build one package per release (--repo)")
@click.option("--kernel-headers-from-apt", "apt_headers", multiple=True,
              metavar="linux-headers-RELEASE",
              help="with --nvidia-source: download this headers package and the headers "
                   "packages it depends on (Debian's -common and linux-kbuild, Ubuntu's "
                   "common headers of the flavour) from --apt-mirror, verified by the "
                   "archive's signed InRelease; repeatable")
@click.option("--nvidia-source-from-apt", "apt_sources", multiple=True,
              metavar="nvidia[-open]-kernel-source[=VERSION]",
              help="like --nvidia-source, downloaded from --apt-mirror (Debian's non-free "
                   "and contrib, Ubuntu's restricted and multiverse), verified by the "
                   "archive's signed InRelease; the highest version unless one is named; "
                   "repeatable")
@click.option("--apt-mirror", envvar="GNI_APT_MIRROR",
              help="the apt archive (Debian or Ubuntu; http://, https:// or file://) the "
                   "-from-apt packages come from [default: --debian-mirror, else "
                   "http://deb.debian.org/debian]")
@click.option("--apt-keyring", "--debian-keyring", "apt_keyring", type=_IN_FILE,
              help="the keyring that signs the apt archive's InRelease, checked by gpgv "
                   "(Ubuntu's: /usr/share/keyrings/ubuntu-archive-keyring.gpg) [default: "
                   "/usr/share/keyrings/debian-archive-keyring.gpg]")
@click.option("--apt-suite", "--debian-suite", "apt_suites", multiple=True,
              help="a suite of the apt archive to read, repeatable: the highest version in "
                   "any wins (Ubuntu's pockets: --apt-suite jammy --apt-suite jammy-updates "
                   "--apt-suite jammy-security) [default: trixie for +deb13 releases, else "
                   "bookworm]")
@click.option("--kernel-headers-from-dnf", "dnf_headers", multiple=True,
              metavar="kernel-devel[-RELEASE]",
              help="with --nvidia-source: download this kernel-devel RPM (the highest that "
                   "matches) from --dnf-mirror, verified by the repository's signed "
                   "repomd.xml (RHEL, Rocky, Amazon Linux 2023); repeatable")
@click.option("--dnf-mirror", envvar="GNI_DNF_MIRROR", metavar="URL",
              help="the dnf repository --kernel-headers-from-dnf reads (its base: "
                   ".../AppStream/x86_64/os, holding repodata/)")
@click.option("--dnf-keyring", type=_IN_FILE,
              help="the public key that signs --dnf-mirror's repomd.xml (armored or binary, "
                   "e.g. /etc/pki/rpm-gpg/RPM-GPG-KEY-Rocky-9); required, none is trusted "
                   "by default")
@click.option("--patch", "patches", multiple=True, type=_IN_FILE,
              help="with --nvidia-source: apply this patch (-p1, in the module tree) first; "
                   "repeatable, in order")
@click.option("--jobs", type=click.IntRange(min=1), default=None,
              help="parallel compile jobs, overall (default: the number of cores); "
                   "several builds share one make job pool of that size")
@click.option("--build-root", "build_root", metavar="DIR|auto",
              help="with --nvidia-source: compile under chroot in this root of the kernel's "
                   "distro, or 'auto' to make (once, cached) a Debian root with mmdebstrap; "
                   "needs root")
@click.option("--build-root-cache", type=_OUT, envvar="GNI_BUILD_ROOT_CACHE",
              help="where --build-root auto keeps its roots [default: "
                   "$XDG_CACHE_HOME/gpu-node-installer/build-roots]")
@click.option("--compile-cache", type=_OUT, envvar="GNI_COMPILE_CACHE",
              help="with --nvidia-source and headers: keep compiled modules here, keyed by "
                   "what shapes their bytes (sources, headers, compiler, patches, the compile "
                   "code); a build with the same inputs copies them instead of compiling")
@click.option("--debian-mirror", envvar="GNI_DEBIAN_MIRROR",
              help="the Debian mirror --build-root auto installs from, and the apt "
                   "archive of the -from-apt packages unless --apt-mirror "
                   "[default: http://deb.debian.org/debian]")
@click.option("--fabricmanager", type=_IN_FILE,
              help="NVIDIA Fabric Manager for NVSwitch/NVLink5 nodes: NVIDIA's fabricmanager-"
                   "linux-<arch>-<version>-archive.tar.xz, its .deb or nv-fabricmanager; "
                   "must be the driver's version")
@click.option("--nvlsm", type=_IN_FILE,
              help="NVIDIA's NVLink Subnet Manager for NVLink5 nodes: nvlsm-linux-<arch>-"
                   "<version>-archive.tar.xz, its .deb or the nvlsm executable")
@click.option("--persistenced", type=_IN_FILE,
              help="the persistence daemon: Debian's nvidia-persistenced .deb or the "
                   "nvidia-persistenced executable")
@click.option("--imex", type=_IN_FILE,
              help="GB200/GB300's IMEX service: NVIDIA's nvidia-imex .deb (or the executable) "
                   "of exactly the driver's version; the agent runs it with IMEX=host")
@click.option("--gdrcopy", type=click.Path(exists=True, path_type=Path),
              help="with --nvidia-source and --kernel-headers: also compile GDRCopy's gdrdrv "
                   "from its sources (a checkout of github.com/NVIDIA/gdrcopy or its "
                   "tarball), an optional module: loaded after nvidia, /dev/gdrdrv made, a "
                   "failure marks only GDRCopyReady")
@click.option("--nvidia-fs", "nvidia_fs", type=click.Path(exists=True, path_type=Path),
              help="with --nvidia-source (open flavour) and --kernel-headers: also compile "
                   "GPUDirect Storage's nvidia-fs from github.com/NVIDIA/gds-nvidia-fs's "
                   "sources, an optional module (GDSReady); refused with the proprietary "
                   "flavour")
@click.option("--driver-version", help="driver version (default: read from the inputs)")
@click.option("--kernel-release", help="kernel release (default: the modules' vermagic)")
@click.option("--flavour", type=click.Choice(["open", "proprietary", "both"]),
              help="module flavour (default: the nvidia module's licence); both: compile "
                   "and publish each (--repo)")
@click.option("--arch", type=click.Choice(arches.ARCHES), default=None,
              help="architecture of the files to take, as `uname -m` says it (a .deb or .run "
                   "of another arch is refused) [default: the --kernel-headers' arch, else "
                   "x86_64]")
@click.option("--os-id", help="only for nodes whose os-release ID is this")
@click.option("--os-version-id", help="only for nodes whose os-release VERSION_ID is this")
@click.option("--os-build-id", help="only for nodes whose os-release BUILD_ID is this")
@click.option("--out-dir", "output_dir", type=_OUT, help="write the package directory here")
@click.option("--repo", type=_OUT,
              help="write into this repository (<kernel>/<driver>/<flavour>/, index.json)")
@click.option("--shard", envvar="GNI_SHARD", metavar="INDEX/COUNT",
              help="with --repo: build only this share (0-based) of the sorted kernel x "
                   "flavour matrix, writing packages and receipts but no index.json (then "
                   "run `package index`); see docs/build-farm.md")
@click.option("--shard-count", type=click.IntRange(min=1), envvar="GNI_SHARD_COUNT",
              help="the number of shards; the index is taken from JOB_COMPLETION_INDEX "
                   "(a Kubernetes Indexed Job)")
@click.option("--shard-costs", type=_IN_FILE,
              help="with --shard: JSON {\"<release> <flavour>\": seconds} of an earlier "
                   "build, to balance the shards by expected cost")
@click.option("--alias", "aliases", multiple=True,
              help="with --repo: point default, latest or a branch (535) at this version")
@click.option("--tarball", type=_OUT, help="also write the package as this .tar.gz")
@click.option("--force", is_flag=True, help="replace an existing package directory")
@click.option("--sign-key", type=_IN_FILE, help="sign every module with this private key")
@click.option("--sign-cert", type=_IN_FILE,
              help="the key's X.509 certificate (with --signatures or --ubuntu-modules: "
                   "verify against it)")
@click.option("--sign-hash", default="sha256", show_default=True,
              help="digest of the signatures: sha256, sha384 or sha512")
@click.option("--resign", is_flag=True, help="replace the signature of signed modules")
@click.option("--signatures", type=_IN_DIR,
              help="attach a vendor's detached signatures: <module>.ko.sig per module")
@click.option("--cos-build", "cos_build", metavar="BUILD_ID",
              help="assemble from Google's published artifacts for this COS build (signed "
                   "prebuilt modules, NVIDIA's runfile), as COS nodes do; with "
                   "--driver-version default|latest|R535|VERSION (docs/cos.md)")
@click.option("--cos-board", default="lakitu", show_default=True,
              help="with --cos-build: the board directory of the build (none for older "
                   "builds without one is tried too)")
@click.option("--cos-tools-url", envvar="COS_TOOLS_URL",
              help="with --cos-build: the cos-tools bucket or a mirror of its layout")
@click.option("--nvidia-runfile-url", envvar="NVIDIA_RUNFILE_URL",
              help="with --cos-build: NVIDIA's runfile bucket or a mirror of it")
@click.option("--ca-bundle", type=_IN_FILE, envvar="DRIVER_CA_BUNDLE",
              help="CA certificates (PEM) for https:// URLs of --cos-build and of the apt "
                   "and dnf archives (--apt-mirror, --dnf-mirror)")
@click.option("--allow-http", is_flag=True,
              help="with --cos-build: allow http:// URLs; for the apt and dnf archives: "
                   "allow a redirect to http:// (an http:// mirror needs no flag: the "
                   "archive's signatures, not the transport, vouch for its files)")
@output_option
def package_build(output: str, os_id: str | None, os_version_id: str | None,
                  os_build_id: str | None, output_dir: Path | None, sign_key: Path | None,
                  sign_cert: Path | None, sign_hash: str, resign: bool,
                  signatures: Path | None, **options: Any) -> None:
    """Make a driver package from .debs/.run and built or compiled kernel modules."""
    from installer.packages.builder import BuildRequest, SigningOptions
    from installer.packages.builder.matrix import MatrixResult, build_packages
    from installer.packages.builder.shard import build_shard, parse_shard

    logs.configure()  # compile progress: JSON events on stderr, readable lines on a terminal
    options["arch"] = _arch(options["arch"], options["kernel_headers"])
    cos = {key: options.pop(key) for key in ("cos_build", "cos_board", "cos_tools_url",
                                             "nvidia_runfile_url", "ca_bundle", "allow_http")}
    if cos["cos_build"] is not None:
        from installer.cli.cosbuild import build_from_cos

        emit(build_from_cos(cos, options, output_dir), output)
        return
    os_match = {key: value for key, value in (("id", os_id), ("version_id", os_version_id),
                                              ("build_id", os_build_id)) if value}
    options["debs"], options["trees"] = tuple(options["debs"]), tuple(options["trees"])
    options["ubuntu_modules"] = tuple(options["ubuntu_modules"])
    options["run_files"], options["aliases"] = (tuple(options["run_files"]),
                                                tuple(options["aliases"]))
    options["kernel_headers"], options["patches"] = (tuple(options["kernel_headers"]),
                                                     tuple(options["patches"]))
    signing = SigningOptions(sign_key, sign_cert, sign_hash, signatures, resign)
    options["daemons"] = tuple((name, path) for name, path in (
        ("nv-fabricmanager", options.pop("fabricmanager")), ("nvlsm", options.pop("nvlsm")),
        ("nvidia-persistenced", options.pop("persistenced")),
        ("nvidia-imex", options.pop("imex"))) if path is not None)
    sources = tuple(options.pop("nvidia_sources"))
    shard = parse_shard(options.pop("shard"), options.pop("shard_count"),
                        os.environ.get("JOB_COMPLETION_INDEX"), options.pop("shard_costs"))
    ubuntu = options.pop("ubuntu_from_apt")
    with tempfile.TemporaryDirectory(prefix="gni-apt-headers-") as downloads:
        if ubuntu is not None:
            from installer.cli.ubuntuapt import add_ubuntu_debs

            add_ubuntu_debs(ubuntu, options, cos, Path(downloads))
        headers, fetched = _from_apt(options, cos, Path(downloads))
        options["kernel_headers"] += _from_dnf(options, cos, Path(downloads) / "dnf")
        options["kernel_headers"] += headers
        sources += fetched
        request = BuildRequest(os=os_match or None, output=output_dir, signing=signing,
                               **options)
        result = (build_shard(request, sources, shard) if shard is not None
                  else build_packages(request, sources))
    emit(result, output)
    if isinstance(result, MatrixResult) and (failed := result.error()) is not None:
        raise failed  # after the report: what was built is published and listed


def _arch(given: str | None, headers: tuple[Path, ...]) -> str:
    """`--arch`, else the arch the kernel headers name (they say it: a .deb's control, a
    tree's .config), else x86_64. Headers of another arch than a given `--arch` are refused
    where they are read."""
    if given is not None:
        return given
    from installer.packages.builder.headersarch import headers_arch

    return headers_arch(headers) or "x86_64"


def _from_apt(options: dict[str, Any], transport: dict[str, Any], work: Path
              ) -> tuple[tuple[Path, ...], tuple[Path, ...]]:
    """`--kernel-headers-from-apt`, `--nvidia-source-from-apt`: the verified .debs
    (headers, sources), popping their options; fetched by the project's downloader with
    `--ca-bundle` / `--allow-http` (`transport`)."""
    names, specs = tuple(options.pop("apt_headers")), tuple(options.pop("apt_sources"))
    keyring, suites = options.pop("apt_keyring"), tuple(options.pop("apt_suites"))
    mirror = options.pop("apt_mirror") or options["debian_mirror"]
    if not names and not specs:
        return (), ()
    from installer.cli.remote import archive_remote
    from installer.packages.builder.aptheaders import AptArchive, fetch_headers, fetch_sources
    from installer.packages.builder.buildroot import DEFAULT_MIRROR

    mirror = mirror or DEFAULT_MIRROR
    plain = transport["allow_http"] or mirror.startswith("http://")
    with archive_remote(transport["ca_bundle"], plain) as remote:
        archive = AptArchive(remote, mirror, work / "indexes", arch=options["arch"],
                             keyring=keyring)
        return (fetch_headers(names, archive, suites, work / "headers"),
                fetch_sources(specs, archive, suites, work / "sources") if specs else ())


def _from_dnf(options: dict[str, Any], cos: dict[str, Any], work: Path) -> tuple[Path, ...]:
    """`--kernel-headers-from-dnf`: the verified kernel-devel RPMs, popping its options."""
    specs = tuple(options.pop("dnf_headers"))
    mirror, keyring = options.pop("dnf_mirror"), options.pop("dnf_keyring")
    if not specs:
        return ()
    from installer.packages.builder.dnfheaders import fetch_kernel_devel
    from installer.packages.builder.inputs import PackageBuildError

    if not mirror:
        raise PackageBuildError("--kernel-headers-from-dnf needs --dnf-mirror (the "
                                "repository's base URL)", remedy="e.g. --dnf-mirror "
                                "https://dl.rockylinux.org/pub/rocky/9/AppStream/x86_64/os")
    from installer.cli.remote import archive_remote

    plain = cos["allow_http"] or mirror.startswith("http://")  # signed, as apt's (above)
    with archive_remote(cos["ca_bundle"], plain) as remote:
        return fetch_kernel_devel(specs, mirror, keyring, work, remote, arch=options["arch"])


@package.command(name="index")
@click.argument("repo", type=_IN_DIR)
@click.option("--alias", "aliases", multiple=True, metavar="NAME=VERSION",
              help="point default, latest or a branch (535) at a version or branch; "
                   "repeatable; wins over --aliases-from and the old index's aliases")
@click.option("--aliases-from", type=_IN_FILE,
              help="take aliases from this file: an index.json or a JSON object of "
                   "name -> version")
@output_option
def package_index(output: str, repo: Path, aliases: tuple[str, ...],
                  aliases_from: Path | None) -> None:
    """Write REPO/index.json from the packages the shards of a build farm wrote.

    Every package's manifest is checked against the digest its build recorded and every
    file against the manifest; run it once, after all shards (docs/build-farm.md)."""
    from installer.packages.index import index_repository, parse_aliases

    emit(index_repository(repo, parse_aliases(aliases, aliases_from)), output)
