"""`fakenode.py` with as many simulated GPUs as FAKE_KERNEL_GPUS says (default 1): the
fake kernel then publishes that many GPUs, so the load stage makes /dev/nvidia0..N-1 as on
a node with N GPUs (what GKE's device plugin counts against the partitioned GPUs).

    FAKE_KERNEL_GPUS=8 python tests/fakenode_gpus.py install --host-root T ...
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from installer.cli import cli
from installer.testing.kernel import FakeKernelHost

if __name__ == "__main__":
    gpus = int(os.environ.get("FAKE_KERNEL_GPUS", "1"))
    cli.main(args=sys.argv[1:], prog_name="gpu-node-installer",
             obj={"host_factory": functools.partial(FakeKernelHost, gpus=gpus)})
