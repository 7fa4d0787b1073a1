"""The node's kernel build tree: kept in `installer.node.buildtree`, which the load stage's
nvidia-peermem rebuild uses too; re-exported here for the fetch stage's on-node build."""

from installer.node.buildtree import (
    NoBuildTreeError,
    copy_build_tree,
    find_build_tree,
    kernel_compiler,
    node_build_dir,
)

__all__ = ["NoBuildTreeError", "copy_build_tree", "find_build_tree", "kernel_compiler",
           "node_build_dir"]
