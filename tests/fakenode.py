"""Run the real CLI against a host tree whose kernel is simulated (FakeKernelHost).

    python tests/fakenode.py install --host-root T --proc-root T/proc --sys-root T/sys ...

Everything but the kernel calls is real: files, HTTP, locks, hashing, pynvml over the
stand-in libraries. The simulated kernel keeps its state in the tree, so a second process
(a rerun after SIGKILL, a container restart) sees the modules the first one loaded.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from installer.cli import cli
from installer.testing.kernel import FakeKernelHost

if __name__ == "__main__":
    cli.main(args=sys.argv[1:], prog_name="gpu-node-installer",
             obj={"host_factory": FakeKernelHost})
