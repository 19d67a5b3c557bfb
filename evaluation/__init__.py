"""microagent.evaluation: which collaboration, if any, pays for its tokens on your questions.

``evaluate`` runs greedy and candidate configurations over your questions (a JSONL
file, ``load_items``), chooses on a selection part and reports on a held-out
report part: accuracy with Wilson intervals, the paired table and exact McNemar
p against greedy, tokens and latency as multiples of greedy's, refusals.
``write_outputs`` writes the report and the chosen configuration's preset file;
``microagent eval`` is the command line over them (``docs/eval.md``). An item may
pin its part (a test set you already hold out stays in the report part), and
``evaluate(..., replay=True)`` recomputes a run's report from its journal alone,
with no engine and no server.

    items = load_items(Path("questions.jsonl"))
    async with VLLMBridge("default") as engine:
        report = await evaluate(items, load_candidates([]), BridgeRunner(engine))
    print(report.table())
"""

from __future__ import annotations

from .._public import publish as _publish
from ._candidates import BUILTIN as BUILTIN
from ._candidates import DEFAULT_CANDIDATES as DEFAULT_CANDIDATES
from ._candidates import GREEDY_CANDIDATE as GREEDY_CANDIDATE
from ._candidates import Candidate as Candidate
from ._candidates import EvalRequest as EvalRequest
from ._candidates import Fields as Fields
from ._candidates import candidate_from_dict as candidate_from_dict
from ._candidates import load_candidate as load_candidate
from ._candidates import load_candidates as load_candidates
from ._candidates import request_for as request_for
from ._errors import BadConfig as BadConfig
from ._errors import BadItem as BadItem
from ._errors import EvalError as EvalError
from ._errors import JournalError as JournalError
from ._errors import MissingReply as MissingReply
from ._evaluate import EvalReport as EvalReport
from ._evaluate import evaluate as evaluate
from ._evaluate import write_outputs as write_outputs
from ._grading import is_correct as is_correct
from ._grading import last_number as last_number
from ._grading import names_in as names_in
from ._http_runner import HTTPRunner as HTTPRunner
from ._items import EvalItem as EvalItem
from ._items import load_items as load_items
from ._items import parse_items as parse_items
from ._preset import preset_of as preset_of
from ._report import ConfigReport as ConfigReport
from ._runner import BridgeRunner as BridgeRunner
from ._runner import Reply as Reply
from ._runner import Runner as Runner
from ._selection import Choice as Choice
from ._selection import Score as Score
from ._selection import choose as choose
from ._split import Split as Split
from ._split import split_items as split_items
from ._stats import PairedTable as PairedTable
from ._stats import holm as holm
from ._stats import mcnemar_p as mcnemar_p
from ._stats import paired_difference_interval as paired_difference_interval
from ._stats import wilson as wilson

__all__ = [
    "BUILTIN",
    "DEFAULT_CANDIDATES",
    "GREEDY_CANDIDATE",
    "BadConfig",
    "BadItem",
    "BridgeRunner",
    "Candidate",
    "Choice",
    "ConfigReport",
    "EvalError",
    "EvalItem",
    "EvalReport",
    "EvalRequest",
    "Fields",
    "HTTPRunner",
    "JournalError",
    "MissingReply",
    "PairedTable",
    "Reply",
    "Runner",
    "Score",
    "Split",
    "candidate_from_dict",
    "choose",
    "evaluate",
    "holm",
    "is_correct",
    "last_number",
    "load_candidate",
    "load_candidates",
    "load_items",
    "mcnemar_p",
    "names_in",
    "paired_difference_interval",
    "parse_items",
    "preset_of",
    "request_for",
    "split_items",
    "wilson",
    "write_outputs",
]

_publish(globals(), __name__)
