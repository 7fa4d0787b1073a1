"""gpu-node-installer: installs a matching NVIDIA kernel module and user-mode driver on a node."""

__version__ = "0.1.0"
