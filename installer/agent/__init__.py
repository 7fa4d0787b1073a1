"""The node agent: the DaemonSet's main container for the life of the pod.

It runs the daemons the node's driver needs (`daemons`), owns readiness after the install
(`readiness`), reports to the cluster (`report`) and ties them together in one loop
(`loop`) that waits on GPU events or a >= 5 s interval, never busy-polls.
"""
