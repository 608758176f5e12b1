"""The name ``doctor --ray``'s probe imports on every node: :func:`node_answer` by its old path.

The probe is shipped by value and imports the node's own answer by name (:data:`.doctor.ray_cluster.PROBE_SOURCE`).
Drivers of every version name this path, and so does this one, so that a driver and a node of different
versions still understand each other: nodes of this version answer here, older nodes from their own module
of this name.
"""

from .doctor.ray_cluster import node_answer

__all__ = ["node_answer"]
