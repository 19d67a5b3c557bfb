"""The built-in collaboration modes: vote, debate, reflect, aggregate, cascade, graph, best_of,
compute, auto.

Each is a ``CollaborationOp`` subclass with its own config class. They are
registered in the default registry by ``microagent.collab`` (explicitly, from
``BUILTIN_MODES``); importing this package registers nothing.
"""

from ..._public import publish as _publish
from ._aggregate import Aggregate as Aggregate
from ._auto import Auto as Auto
from ._auto import AutoConfig as AutoConfig
from ._best_of import BestOf as BestOf
from ._best_of import BestOfConfig as BestOfConfig
from ._cascade import Cascade as Cascade
from ._cascade import CascadeConfig as CascadeConfig
from ._compute import Compute as Compute
from ._compute import ComputeConfig as ComputeConfig
from ._debate import Debate as Debate
from ._debate import DebateConfig as DebateConfig
from ._graph import GraphConfig as GraphConfig
from ._graph import GraphMode as GraphMode
from ._reflect import Reflect as Reflect
from ._reflect import ReflectConfig as ReflectConfig
from ._vote import NO_CONFIDENT_ANSWER as NO_CONFIDENT_ANSWER
from ._vote import Vote as Vote
from ._vote import VoteConfig as VoteConfig

#: The modes every default registry starts with.
BUILTIN_MODES = (Vote, Debate, Reflect, Aggregate, Cascade, GraphMode, BestOf, Compute, Auto)

__all__ = [
    "BUILTIN_MODES",
    "NO_CONFIDENT_ANSWER",
    "Aggregate",
    "Auto",
    "AutoConfig",
    "BestOf",
    "BestOfConfig",
    "Cascade",
    "CascadeConfig",
    "Compute",
    "ComputeConfig",
    "Debate",
    "DebateConfig",
    "GraphConfig",
    "GraphMode",
    "Reflect",
    "ReflectConfig",
    "Vote",
    "VoteConfig",
]

_publish(globals(), __name__)
