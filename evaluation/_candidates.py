"""Configurations to evaluate: greedy, the built-in candidates, and files.

A configuration is what a client sends beside its messages: ``agents`` and
``collaboration`` (the openai SDK's ``extra_body``), optionally ``temperature``
and ``max_tokens``, in the shape of the published quality files
(``bench/results/quality_best.json``); ``serve_args`` there names the
``microagent serve`` options it needs over HTTP. An item's choices are added as
``collaboration.answer.choices``, so one configuration serves closed and free
questions. Greedy is the baseline every candidate is judged against: one call at
temperature 0, constrained to the choices on closed questions.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

import attrs

from ..collab import InvalidCollaboration, prepare_collaboration
from ._errors import BadConfig
from ._items import EvalItem

#: the temperature of a configuration that sets none (the collaboration default)
DEFAULT_TEMPERATURE: Final = 0.7
#: the completion budget of a configuration that sets none
DEFAULT_MAX_TOKENS: Final = 32
#: most bytes of a configuration file
MAX_CONFIG_BYTES: Final = 1024 * 1024
#: the baseline's name
GREEDY: Final = "greedy"

_FILE_FIELDS: Final = frozenset(
    {"name", "agents", "collaboration", "temperature", "max_tokens", "serve_args"}
)

JSONObject = dict[str, object]


@attrs.frozen
class Fields:
    """The request fields of a configuration for one kind of question.

    Attributes:
        agents: the request's ``agents``.
        collaboration: the request's ``collaboration`` (``mode`` included).
        temperature: the request's temperature (None: ``DEFAULT_TEMPERATURE``).
        max_tokens: the request's completion budget (None: the run's default).
    """

    agents: tuple[JSONObject, ...]
    collaboration: JSONObject
    temperature: float | None = None
    max_tokens: int | None = None

    def to_dict(self) -> JSONObject:
        out: JSONObject = {"agents": list(self.agents), "collaboration": self.collaboration}
        if self.temperature is not None:
            out["temperature"] = self.temperature
        if self.max_tokens is not None:
            out["max_tokens"] = self.max_tokens
        return out


@attrs.frozen
class Candidate:
    """A named configuration: its fields for closed questions and for free answers.

    Attributes:
        name: how reports and the preset name it.
        closed: its fields on items with choices.
        free: its fields on items without (a file gives one set for both).
        serve_args: ``microagent serve`` options it needs over HTTP (``--calculator``).
        source: the file or built-in it came from.
    """

    name: str
    closed: Fields
    free: Fields
    serve_args: tuple[str, ...] = ()
    source: str = "built-in"

    def fingerprint(self) -> str:
        """sha256 (16 hex digits) of its request fields: a changed configuration reruns."""
        body = json.dumps([self.closed.to_dict(), self.free.to_dict()], sort_keys=True)
        return hashlib.sha256(body.encode()).hexdigest()[:16]


@attrs.frozen
class EvalRequest:
    """One configuration on one question: what a client sends.

    Attributes:
        question: the user message.
        agents: the request's ``agents``.
        collaboration: the request's ``collaboration``, the item's choices added.
        temperature: the request's temperature.
        max_tokens: the request's completion budget.
        logprob: a runner asks the collaboration for its answer's log-probability
            (``collaboration.logprob``; set on greedy's requests: its confidence cut-off).
    """

    question: str
    agents: tuple[JSONObject, ...]
    collaboration: JSONObject
    temperature: float
    max_tokens: int
    logprob: bool = False

    def extra_body(self) -> JSONObject:
        """The fields an OpenAI client sends as ``extra_body``."""
        return {"agents": list(self.agents), "collaboration": self.collaboration}


def default_budget(item: EvalItem, max_tokens: int) -> int:
    """The budget of a configuration that sets none, on ``item``: the item's own, else
    the run's ``max_tokens`` (the journal keys replies by it)."""
    return item.max_tokens if item.max_tokens is not None else max_tokens


def request_for(candidate: Candidate, item: EvalItem, max_tokens: int) -> EvalRequest:
    """``candidate``'s request for ``item``.

    The budget is the configuration's ``max_tokens``, else the item's, else the run's
    ``max_tokens``. Closed items add their choices as ``answer.choices``; on free ones
    a vote (or a collaboration with an ``answer`` spec) gets the budget as
    ``answer_tokens``, a direct voter's whole answer (as ``bench/quality.py`` sends it).
    """
    fields = candidate.closed if item.choices else candidate.free
    collaboration = dict(fields.collaboration)
    budget = default_budget(item, max_tokens) if fields.max_tokens is None else fields.max_tokens
    if item.choices:
        answer = collaboration.get("answer")
        spec = dict(answer) if isinstance(answer, Mapping) else {}
        collaboration["answer"] = {**spec, "choices": list(item.choices)}
    elif collaboration.get("mode") == "vote" or "answer" in collaboration:
        collaboration.setdefault("answer_tokens", budget)
    temperature = fields.temperature if fields.temperature is not None else DEFAULT_TEMPERATURE
    scored = candidate.name == GREEDY  # greedy's own confidence, for its cut-off
    return EvalRequest(item.question, fields.agents, collaboration, temperature, budget, scored)


def _vote(n: int, **collaboration: object) -> Fields:
    return Fields(
        agents=({"name": "voter", "count": n},),
        collaboration={"mode": "vote", "style": "direct", **collaboration},
    )


#: greedy: one constrained voter on closed questions, one plain call on free ones
GREEDY_CANDIDATE: Final = Candidate(
    GREEDY,
    closed=attrs.evolve(_vote(1), temperature=0.0),
    free=Fields(
        agents=({"name": "agent", "count": 1},), collaboration={"mode": "auto"}, temperature=0.0
    ),
)
_COMPUTE: Final = Fields(
    agents=({"name": "solver", "count": 1, "temperature": 0.0},),
    collaboration={"mode": "compute"},
)
_VOTE3: Final = _vote(3, early_stop=False)

#: the built-in candidates, by name: what ``bench/quality.py`` runs and publishes
BUILTIN: Final[Mapping[str, Candidate]] = {
    # the published configuration (bench/results/quality_best.json): program-aided,
    # one greedy solver writes arithmetic that the sandboxed calculator evaluates
    "compute": Candidate("compute", _COMPUTE, _COMPUTE, ("--calculator",)),
    # self-consistency: three sampled voters, within three times greedy's tokens
    "vote3": Candidate("vote3", _VOTE3, _VOTE3),
}
#: the candidates of a run given none
DEFAULT_CANDIDATES: Final = ("compute", "vote3")


def _check(source: str, fields: Fields) -> None:
    """Validate the fields as the server would, naming the field.

    A configuration valid only with choices (a soft vote reads their probabilities)
    is accepted: on a free question the server refuses it, and the report counts
    that refusal.
    """
    options = dict(fields.collaboration)
    mode = options.pop("mode", None)
    if not isinstance(mode, str):
        raise BadConfig(source, "collaboration.mode must be a mode name")
    try:
        prepare_collaboration(mode, list(fields.agents), options)
    except InvalidCollaboration as exc:
        answer = options.get("answer")
        spec = dict(answer) if isinstance(answer, Mapping) else {}
        closed = {**options, "answer": {**spec, "choices": ["a", "b"]}}
        try:
            prepare_collaboration(mode, list(fields.agents), closed)
        except InvalidCollaboration:
            raise BadConfig(source, str(exc)) from None


def candidate_from_dict(data: object, source: str, name: str = "") -> Candidate:
    """A configuration's JSON object as a candidate, validated.

    Raises:
        BadConfig: naming the source and the field.
    """
    if not isinstance(data, Mapping):
        raise BadConfig(source, "must be a JSON object")
    unknown = sorted(str(k) for k in data if k not in _FILE_FIELDS)
    if unknown:
        raise BadConfig(source, f"{unknown[0]!r} is not a field (fields: {sorted(_FILE_FIELDS)})")
    agents = data.get("agents", [])
    if not isinstance(agents, list) or not all(isinstance(a, Mapping) for a in agents):
        raise BadConfig(source, "agents must be a list of objects")
    collaboration = data.get("collaboration")
    if not isinstance(collaboration, Mapping):
        raise BadConfig(source, "collaboration must be an object")
    temperature = data.get("temperature")
    if temperature is not None and (
        isinstance(temperature, bool) or not isinstance(temperature, int | float)
    ):
        raise BadConfig(source, "temperature must be a number")
    max_tokens = data.get("max_tokens")
    if max_tokens is not None and (
        isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1
    ):
        raise BadConfig(source, "max_tokens must be a positive integer")
    serve_args = data.get("serve_args", [])
    if not isinstance(serve_args, list) or not all(isinstance(a, str) for a in serve_args):
        raise BadConfig(source, "serve_args must be a list of strings")
    given = data.get("name", name)
    if not isinstance(given, str) or not given.strip() or len(given) > 100:
        raise BadConfig(source, "name must be a non-empty string of at most 100 characters")
    fields = Fields(
        agents=tuple(dict(a) for a in agents),
        collaboration=dict(collaboration),
        temperature=None if temperature is None else float(temperature),
        max_tokens=max_tokens,
    )
    _check(source, fields)
    return Candidate(given, fields, fields, tuple(serve_args), source)


def load_candidate(spec: str) -> Candidate:
    """A built-in candidate by name, or a configuration file (named after its stem).

    Raises:
        BadConfig: an unknown name, an unreadable, oversized or invalid file.
    """
    if spec in BUILTIN:
        return BUILTIN[spec]
    path = Path(spec)
    if not path.is_file():
        raise BadConfig(spec, f"is neither a file nor a built-in candidate {sorted(BUILTIN)}")
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise BadConfig(spec, f"is larger than {MAX_CONFIG_BYTES} bytes")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise BadConfig(spec, f"is not JSON: {exc}") from None
    return candidate_from_dict(data, spec, path.stem)


def load_candidates(specs: Sequence[str]) -> list[Candidate]:
    """The candidates of ``specs`` (``DEFAULT_CANDIDATES`` when empty), names unique.

    Raises:
        BadConfig: a bad one, a duplicate name, or one named ``greedy`` (the baseline).
    """
    out = [load_candidate(s) for s in (specs or DEFAULT_CANDIDATES)]
    seen: set[str] = set()
    for c in out:
        if c.name == GREEDY:
            raise BadConfig(c.source, "'greedy' is the baseline's name; rename the candidate")
        if c.name in seen:
            raise BadConfig(c.source, f"the name {c.name!r} is used twice")
        seen.add(c.name)
    return out
