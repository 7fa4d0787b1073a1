"""The node agent (issue 24): the DaemonSet's main container for the life of the pod.

It runs the daemons the node's driver needs (Fabric Manager, NVLink Subnet Manager,
persistenced), keeps readiness true only while the fabric really works, and watches the
GPUs' health (Xid). A room beside the live upgrade: it uses the node seam and the shared
rooms, never the CLI, and never imports `installer.upgrade` (import-linter checks it).
"""
