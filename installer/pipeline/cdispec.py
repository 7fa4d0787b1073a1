"""`cdi`: the CDI spec this node gets, built now, for debugging and for `diff` against
`nvidia-ctk cdi generate` (read only: the signal stage is what writes it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from installer.context import Context
from installer.errors import VerificationError
from installer.installdir import cdi, cdifile, cdimig
from installer.installdir.readiness import read_ready
from installer.installdir.versions import current_name


class NoSpecError(VerificationError):
    """No verified GPU, staged version or GPU device node: there is nothing to describe."""


@dataclass(frozen=True)
class CdiSpec:
    """The spec, and where `signal` writes it."""

    spec: cdi.Spec
    path: str

    def log_fields(self) -> dict[str, Any]:
        return {"path": self.path, "devices": len(self.spec["devices"])}

    def render(self, output: str) -> str:
        return cdi.render(self.spec, output).rstrip("\n")


def current_spec(ctx: Context) -> CdiSpec:
    """From `.ready.json`'s GPUs (else those our last spec named), the version in service
    and the device nodes as they are now."""
    version = current_name(ctx.install_root)
    ready = read_ready(ctx.config, ctx.host) or {}
    gpus = cdi.gpus_from(ready.get("gpus")) or cdi.gpus_from(
        cdifile.read_record(ctx.install_root).get("gpus"))
    if version is None or not gpus:
        missing = "nothing is staged" if version is None else "no verified GPU"
        raise NoSpecError(f"no CDI spec to show: {missing} in {ctx.config.install_dir}",
                          remedy="run `install` (or `signal`) on this node first")
    spec = cdimig.node_spec(ctx.host, ctx.config.install_dir, version, gpus)
    if spec is None:
        raise NoSpecError(f"no CDI spec to show: no GPU device node (/dev/nvidia<N>) under "
                          f"{ctx.host.roots.dev}", remedy="run `load` (or `install`) first")
    return CdiSpec(spec, str(cdifile.spec_node_path(ctx.config)))
