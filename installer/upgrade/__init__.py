"""The live upgrade: free the GPUs through Kubernetes so a new driver can replace a serving one.

`flow` sequences it (plan, cordon, evict, wait, finish), `skip` reads the Node's
upgrade.skip label before any of it, `selection` decides which pods go (and which may not),
`evictions` makes them go and waits until they are gone, `rollout` bounds how many nodes are
unavailable at once. It uses the node seam (holders from /proc, the API
client) and the load stage's view of the loaded modules; the install pipeline calls it,
nothing below the pipeline imports it.
"""
