"""The node agent: the DaemonSet's main container for the life of the pod.

It runs the daemons the node's driver needs (`daemons`, `plan`: Fabric Manager, NVLink
Subnet Manager, persistenced), owns readiness after the install (`readiness`: true only
while the fabric really works), watches the GPUs' health (`health`: Xid), reports to the
cluster (`report`), and ties them together in one loop (`loop`) that waits on GPU events or
a >= 5 s interval, never busy-polls. A room beside the live upgrade: it uses the node seam
and the shared rooms, never the CLI, and never imports `installer.upgrade`.
"""
