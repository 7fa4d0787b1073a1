#!/usr/bin/env python3
"""Pin the pushed image by digest in a kustomize overlay the user keeps (`make push OVERLAY=`).

Writes OVERLAY/image/kustomization.yaml, a kustomize Component this script owns and rewrites on
every push: an `images:` entry replacing the shipped image name with REPOSITORY@DIGEST, and,
with --pull-secret, the pods' `imagePullSecrets`. OVERLAY/kustomization.yaml is the user's:
written once when missing (the shipped overlay named by --base as its resource, the component
listed), never rewritten. Shipped files (daemonset/ in this repository) are never written.
Standard library only: `make push` runs it with the system's python3.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHIPPED = "ghcr.io/gpu-node-installer/gpu-node-installer"  # the name every shipped overlay sets
COMPONENT = "image"
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
REFERENCE = re.compile(r"[a-z0-9]+([._:-][a-z0-9]+)*(/[a-z0-9]+([._-][a-z0-9]+)*)+")
SECRET = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")


def component(repository: str, digest: str, pull_secret: str | None) -> str:
    text = (f"# Written by `make push` (scripts/pin-image.py) and rewritten by the next push:\n"
            f"# the image as pushed, by digest. Keep your own changes in ../kustomization.yaml.\n"
            f"apiVersion: kustomize.config.k8s.io/v1alpha1\n"
            f"kind: Component\n"
            f"images:\n"
            f"  - name: {SHIPPED}\n"
            f"    newName: {repository}\n"
            f"    digest: {digest}\n")
    if pull_secret:
        text += ("# The registry's credentials: a kubernetes.io/dockerconfigjson Secret in the\n"
                 "# pods' namespace (kubectl create secret docker-registry, docs/image.md).\n"
                 "patches:\n"
                 "  - target: {kind: DaemonSet|Job}\n"
                 "    patch: |-\n"
                 "      - op: add\n"
                 "        path: /spec/template/spec/imagePullSecrets\n"
                 f"        value: [{{name: {pull_secret}}}]\n")
    return text


def overlay(base: str) -> str:
    return ("# Your overlay: written once by `make push`, yours to edit (settings, patches).\n"
            "apiVersion: kustomize.config.k8s.io/v1beta1\n"
            "kind: Kustomization\n"
            "resources:\n"
            f"  - {base}\n"
            "components:\n"
            f"  - {COMPONENT}    # the pushed image by digest (`make push` rewrites it)\n")


def fail(message: str) -> int:
    print(f"make push: {message}", file=sys.stderr)
    return 2


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--overlay", type=Path, required=True)
    parser.add_argument("--repository", required=True, help="REGISTRY/PATH/NAME, no tag")
    parser.add_argument("--digest", required=True)
    parser.add_argument("--base", default="daemonset/overlays/gke-cos",
                        help="the shipped overlay a new OVERLAY builds on")
    parser.add_argument("--pull-secret", default="")
    args = parser.parse_args(argv)
    digest = args.digest.strip()
    if not DIGEST.fullmatch(digest):
        return fail(f"not an image digest: {digest!r}; fix: the sha256:<64 hex digits> "
                    "the push printed (did it print one?)")
    if not REFERENCE.fullmatch(args.repository):
        return fail(f"not an image repository: {args.repository!r}; "
                    "fix: REGISTRY=host[:port]/path")
    if args.pull_secret and not SECRET.fullmatch(args.pull_secret):
        return fail(f"not a Secret name: {args.pull_secret!r}; fix: a lower-case DNS name "
                    "such as regcred")
    target = args.overlay.resolve()
    if target == REPO / "daemonset" or (REPO / "daemonset") in target.parents:
        return fail(f"OVERLAY={args.overlay} is inside the shipped daemonset/: "
                    "keep your overlay outside this repository's files")
    base = (REPO / args.base).resolve()
    if not (base / "kustomization.yaml").is_file():
        return fail(f"OVERLAY_BASE={args.base}: no kustomization.yaml there; fix: a shipped "
                    "overlay such as daemonset/overlays/gke-cos")
    (target / COMPONENT).mkdir(parents=True, exist_ok=True)
    pin = target / COMPONENT / "kustomization.yaml"
    pin.write_text(component(args.repository, digest, args.pull_secret or None))
    print(f"pinned {args.repository}@{digest} in {pin}")
    kustomization = target / "kustomization.yaml"
    if not kustomization.exists():
        kustomization.write_text(overlay(os.path.relpath(base, target)))
        print(f"wrote {kustomization} (on {args.base})")
    elif not re.search(rf"^\s*-\s*{COMPONENT}\s*(#.*)?$|\[\s*{COMPONENT}\s*\]",
                       kustomization.read_text(), re.MULTILINE):
        print(f"make push: {kustomization} does not list the component: add "
              f"`components: [{COMPONENT}]` to use the pinned image", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
