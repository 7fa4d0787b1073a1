"""`status` names the image's SBOM by digest (installer/pipeline/imagesbom.py): in the image,
the file beside the interpreter's prefix; in a development install, nothing at all."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

from installer import __version__
from installer.pipeline import imagesbom


def test_the_sbom_beside_the_prefix_is_named_by_its_sha256(tmp_path: Path) -> None:
    body = b'{"bomFormat": "CycloneDX", "components": []}\n' * 5000  # over one read chunk
    (tmp_path / "sbom.cdx.json").write_bytes(body)
    image = imagesbom.describe(tmp_path)
    assert image == {"version": __version__, "sbom": str(tmp_path / "sbom.cdx.json"),
                     "sbom_sha256": hashlib.sha256(body).hexdigest()}
    assert imagesbom.image_line(image) == (
        f"Image:           {__version__}, SBOM {tmp_path / 'sbom.cdx.json'} "
        f"sha256:{hashlib.sha256(body).hexdigest()}")


def test_no_sbom_no_image(tmp_path: Path) -> None:
    assert imagesbom.describe(tmp_path) is None
    (tmp_path / "sbom.cdx.json").mkdir()  # unreadable as a file: nothing to vouch for
    assert imagesbom.describe(tmp_path) is None
    assert imagesbom.image_line(None) is None


def test_status_in_a_development_install_shows_no_image(tmp_path: Path) -> None:
    assert not (Path(sys.prefix) / "sbom.cdx.json").exists()
    root = tmp_path / "node"
    subprocess.run([sys.executable, "-m", "installer.testing", "gke-cos-a100x8", str(root)],
                   check=True, capture_output=True, timeout=60)
    args = [sys.executable, "-m", "installer", "status", "--host-root", str(root),
            "--proc-root", f"{root}/proc", "--sys-root", f"{root}/sys"]
    report = subprocess.run([*args, "-o", "json"], capture_output=True, text=True,
                            timeout=60, check=True)
    assert json.loads(report.stdout)["image"] is None
    text = subprocess.run(args, capture_output=True, text=True, timeout=60, check=True)
    assert "Image:" not in text.stdout and "Ready:" in text.stdout
