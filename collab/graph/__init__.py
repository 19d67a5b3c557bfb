"""The graph IR of the ``graph`` mode: nodes, edges, conditions, and the graph's JSON schema.

The program as data (here), the scheduler that runs it (``collab.modes``'s
graph mode), and the engine bridge it runs on: three layers, as in SGLang's
frontend (``ir`` / ``interpreter`` / ``backend``).
"""

from ..._public import publish as _publish
from ._ir import MAX_GRAPH_EDGES as MAX_GRAPH_EDGES
from ._ir import MAX_GRAPH_NODES as MAX_GRAPH_NODES
from ._ir import MAX_GRAPH_TURNS as MAX_GRAPH_TURNS
from ._ir import MAX_LOOP_ITERATIONS as MAX_LOOP_ITERATIONS
from ._ir import MAX_NODE_COUNT as MAX_NODE_COUNT
from ._ir import NODE_AGENT_FIELDS as NODE_AGENT_FIELDS
from ._ir import Condition as Condition
from ._ir import Edge as Edge
from ._ir import Graph as Graph
from ._ir import Node as Node
from ._ir import Predicate as Predicate
from ._ir import as_graph as as_graph
from ._schema import graph_json_schema as graph_json_schema

__all__ = [
    "MAX_GRAPH_EDGES",
    "MAX_GRAPH_NODES",
    "MAX_GRAPH_TURNS",
    "MAX_LOOP_ITERATIONS",
    "MAX_NODE_COUNT",
    "NODE_AGENT_FIELDS",
    "Condition",
    "Edge",
    "Graph",
    "Node",
    "Predicate",
    "as_graph",
    "graph_json_schema",
]

_publish(globals(), __name__)
