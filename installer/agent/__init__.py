"""The node agent (issue 24): the driver's daemons, readiness that follows the node, GPU health."""
