"""The kernel tier's private apt (never the system's sources or package state), and the
small helpers every asset builder shares: the cache root, progress lines, tool runs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NONFREE_COMPONENTS = "main contrib non-free non-free-firmware"
INDEX_MAX_AGE_S = 7 * 24 * 3600  # a new Debian kernel is picked up within a week


class AssetError(RuntimeError):
    """An asset could not be fetched or built; the message says which and why."""


def cache_root() -> Path:
    """Where assets live: outside the repo so clones and CI runs share them."""
    env = os.environ.get("GNI_TEST_CACHE")
    base = Path(env) if env else Path.home() / ".cache" / "gpu-node-installer-test"
    return base


def log(msg: str) -> None:
    """Progress goes to stderr: cold runs take minutes and silence looks like a hang."""
    print(f"[kernel-assets] {msg}", file=sys.stderr, flush=True)


def run(cmd: list[str], *, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    """Run a tool, raising AssetError with its output tail when it fails."""
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-3000:]
        raise AssetError(f"{' '.join(cmd[:4])}... exited {proc.returncode}:\n{tail}")
    return proc.stdout


# --- private apt: never touches the system's sources or package state -------------------


def _system_stanzas() -> list[dict[str, str]]:
    """The machine's configured Debian archives (deb822 and one-line formats)."""
    stanzas: list[dict[str, str]] = []
    parts = Path("/etc/apt/sources.list.d")
    for path in sorted(parts.glob("*.sources")) if parts.is_dir() else []:
        for block in re.split(r"\n\s*\n", path.read_text()):
            fields: dict[str, str] = {}
            for line in block.splitlines():
                if ":" in line and not line.startswith(("#", " ")):
                    key, _, value = line.partition(":")
                    fields[key.strip()] = value.strip()
            if "deb" in fields.get("Types", "").split() and fields.get("URIs"):
                stanzas.append(fields)
    one_line = [Path("/etc/apt/sources.list"), *sorted(parts.glob("*.list"))]
    for path in one_line:
        if not path.is_file():
            continue
        for line in path.read_text().splitlines():
            m = re.match(r"^deb\s+(?:\[(?P<opts>[^\]]*)\]\s+)?(?P<uri>\S+)\s+(?P<suite>\S+)", line)
            if m:
                signed = re.search(r"signed-by=(\S+)", m["opts"] or "")
                stanza = {"Types": "deb", "URIs": m["uri"], "Suites": m["suite"]}
                if signed:
                    stanza["Signed-By"] = signed[1]
                stanzas.append(stanza)
    return stanzas


def _debian_stanzas() -> list[dict[str, str]]:
    """Bookworm archives only, widened to the non-free components NVIDIA's sources need."""
    codename = os.environ.get("GNI_TEST_DEBIAN_SUITE", "bookworm")
    out = []
    for fields in _system_stanzas():
        suites = [s for s in fields.get("Suites", "").split() if s.startswith(codename)]
        if suites:
            stanza = dict(fields, Suites=" ".join(suites), Components=NONFREE_COMPONENTS)
            out.append(stanza)
    if not out:
        raise AssetError(f"no apt source for Debian {codename} is configured on this machine")
    return out


class Apt:
    """apt-get/apt-cache over a private sources list and state dir under the cache."""

    def __init__(self, root: Path, stanzas: list[dict[str, str]] | None = None) -> None:
        self.root = root
        self.stanzas = stanzas  # None: the machine's bookworm archives, widened

    def options(self) -> list[str]:
        r = self.root
        opts = [
            f"-oDir::Etc::SourceList={r / 'sources.list'}",
            f"-oDir::Etc::SourceParts={r / 'sources.list.d'}",
            f"-oDir::State::Lists={r / 'lists'}",
            f"-oDir::Cache={r / 'cache'}",
        ]
        if os.geteuid() == 0:
            opts.append("-oAPT::Sandbox::User=root")
        return opts

    def update(self, *, force: bool = False) -> None:
        """Refresh the private index (once; again only when a download misses)."""
        stamp = self.root / "updated"
        fresh = stamp.exists() and time.time() - stamp.stat().st_mtime < INDEX_MAX_AGE_S
        if fresh and not force:
            return
        for sub in ("lists/partial", "cache/archives/partial", "sources.list.d"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        (self.root / "sources.list").write_text("")
        text = "\n".join(
            "".join(f"{k}: {v}\n" for k, v in stanza.items())
            for stanza in self.stanzas or _debian_stanzas()
        )
        (self.root / "sources.list.d" / "gni-test.sources").write_text(text)
        log("apt-get update (private index, incl. non-free)")
        run(["apt-get", *self.options(), "update"])
        stamp.write_text("")

    def query(self, *args: str) -> str:
        self.update()
        return run(["apt-cache", *self.options(), *args])

    def version(self, package: str) -> str:
        """Candidate version of a package in the private index."""
        out = self.query("show", "--no-all-versions", package)
        m = re.search(r"^Version: (\S+)", out, re.M)
        if not m:
            raise AssetError(f"apt knows no version of {package}")
        return m[1]

    def versions(self, package: str) -> list[str]:
        """Every version of a package the private index offers (all suites)."""
        return re.findall(r"^Version: (\S+)", self.query("show", package), re.M)

    def download(self, specs: list[str], dest: Path) -> None:
        """apt-get download packages (`name=version`) into dest, never installing them."""
        try:
            self.update()
            run(["apt-get", *self.options(), "download", *specs], cwd=dest)
        except AssetError:
            self.update(force=True)  # the index may name a version the archive dropped
            run(["apt-get", *self.options(), "download", *specs], cwd=dest)

    def download_extract(self, spec: str, dest: Path) -> None:
        """apt-get download one package and dpkg-deb -x it into dest (never installed)."""
        with tempfile.TemporaryDirectory(dir=self.root) as tmp:
            self.download([spec], Path(tmp))
            for deb in Path(tmp).glob("*.deb"):
                run(["dpkg-deb", "-x", str(deb), str(dest)])


def apt() -> Apt:
    root = cache_root() / "apt"
    root.mkdir(parents=True, exist_ok=True)
    return Apt(root)


TRIXIE_STANZA = {"Types": "deb", "URIs": "http://deb.debian.org/debian", "Suites": "trixie",
                 "Components": NONFREE_COMPONENTS,
                 "Signed-By": "/usr/share/keyrings/debian-archive-keyring.gpg"}


def trixie_apt() -> Apt:
    """Debian trixie (another distro's kernel: 6.12, gcc-14), its own index under the cache."""
    root = cache_root() / "apt-trixie"
    root.mkdir(parents=True, exist_ok=True)
    return Apt(root, [dict(TRIXIE_STANZA, URIs=os.environ.get("GNI_TEST_TRIXIE_MIRROR",
                                                                TRIXIE_STANZA["URIs"]))])
