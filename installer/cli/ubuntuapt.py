"""`package build --ubuntu-modules-from-apt BRANCH`: Canonical's signed modules for
`--kernel-release` and the matching user-mode packages, fetched from an Ubuntu archive and
verified (`installer.packages.builder.ubuntuapt`), then built as `--ubuntu-modules` +
`--deb` would build them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from installer.packages.builder.inputs import PackageBuildError


def add_ubuntu_debs(spec: str, options: dict[str, Any], transport: dict[str, Any],
                    work: Path) -> None:
    """Fetch the .debs into `work` and add them to `options` (`ubuntu_modules`, `debs`);
    the --apt-* options are read, not consumed."""
    from installer.cli.remote import archive_remote
    from installer.packages.builder.aptarchive import UBUNTU_KEYRING, AptArchive
    from installer.packages.builder.ubuntuapt import UBUNTU_MIRRORS, fetch, parse_branch, pockets

    branch = parse_branch(spec)
    kernel = options["kernel_release"]
    if kernel is None:
        raise PackageBuildError("--ubuntu-modules-from-apt needs --kernel-release (the "
                                "Ubuntu kernel the modules are for)",
                                remedy="e.g. --kernel-release 6.8.0-44-generic")
    if options["ubuntu_modules"]:
        raise PackageBuildError("give --ubuntu-modules or --ubuntu-modules-from-apt, not both")
    if not options["apt_suites"]:
        raise PackageBuildError("--ubuntu-modules-from-apt needs --apt-suite (the Ubuntu "
                                "release: jammy reads jammy, jammy-updates and "
                                "jammy-security)", remedy="e.g. --apt-suite noble")
    mirror = options["apt_mirror"] or UBUNTU_MIRRORS[options["arch"]]
    plain = transport["allow_http"] or mirror.startswith("http://")
    with archive_remote(transport["ca_bundle"], plain) as remote:
        archive = AptArchive(remote, mirror, work / "ubuntu-indexes", arch=options["arch"],
                             keyring=options["apt_keyring"] or UBUNTU_KEYRING)
        debs = fetch(archive, pockets(options["apt_suites"]), kernel, branch,
                     work / "ubuntu", driver_version=options["driver_version"])
    options["ubuntu_modules"] = (debs.modules,)
    options["debs"] = (*options["debs"], *debs.user)
