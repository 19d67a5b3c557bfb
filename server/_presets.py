"""Presets: a collaboration served under a model name (``serve --preset NAME=FILE``).

A preset is a named ``agents`` + ``collaboration`` (the file ``microagent eval``
writes, or one written by hand), optionally with the ``model`` whose engine runs
it. A request whose ``model`` is the preset's name runs that collaboration, so a
client that can only pick a model name (Open WebUI, an IDE plugin, LiteLLM's
proxy) can start one.

Its fields are parsed by the request's own schema (``ChatCompletionRequest``) when
the file is read; ``check_preset`` (in ``_plan``) then holds it to the server's
limits, tools and engines exactly as it would a request's, so a bad preset stops
``serve`` at startup, naming the file and the field, instead of failing every
request later.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
from pydantic import ValidationError

from ._errors import bad_request
from ._schemas import ChatCompletionRequest, CollaborationModel

#: The largest preset file ``serve`` reads (a preset is a few agents and options).
MAX_PRESET_BYTES = 256 * 1024
#: The most presets one server takes.
MAX_PRESETS = 256
#: A preset's name: what a client sends as ``model`` (no spaces, no control characters).
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}")
#: The keys of a preset document (``name`` is what ``microagent eval`` writes; the
#: name given to ``--preset`` is the one served).
PRESET_KEYS = frozenset({"name", "description", "model", "agents", "collaboration"})
#: Names a preset cannot take: ``default`` already means the first served model.
RESERVED_NAMES = frozenset({"default"})


class PresetError(ValueError):
    """A preset ``serve`` refuses; the message names the preset's source and the field."""


@attrs.frozen(kw_only=True)
class Preset:
    """A collaboration served under a model name.

    Attributes:
        name: the model name clients send to run it.
        source: where it came from (its file, or ``--config``'s entry), for messages.
        model: the served model whose engine runs it (None: the first served model).
        agents: the request's ``agents``, as given (parsed by the request's schema).
        collaboration: the request's ``collaboration``, as given.
        description: a line shown in ``/v1/models`` (optional).
    """

    name: str
    source: str
    model: str | None
    agents: tuple[Mapping[str, Any], ...]
    collaboration: Mapping[str, Any]
    description: str | None = None

    @property
    def mode(self) -> str:
        """The collaboration's mode (``vote`` when the preset names none, as a request)."""
        return str(self.collaboration.get("mode", "vote"))

    def agent_count(self) -> int:
        """How many agents its specs declare (their ``count``, 1 when not given)."""
        return sum(int(a.get("count", 1)) for a in self.agents)

    def card(self, created: int, parent: str) -> dict[str, Any]:
        """Its ``/v1/models`` entry: a model whose ``parent`` is the engine that runs it
        (as vLLM lists a LoRA adapter), with a ``collaboration`` field saying what runs."""
        card: dict[str, Any] = {
            "id": self.name,
            "object": "model",
            "created": created,
            "owned_by": "microagent",
            "root": parent,
            "parent": parent,
            "collaboration": {"mode": self.mode, "agents": self.agent_count()},
        }
        if self.description:
            card["description"] = self.description
        return card

    def apply(self, body: ChatCompletionRequest) -> ChatCompletionRequest:
        """``body`` (whose ``model`` named this preset) as the collaboration request it means.

        Raises:
            ApiError: 400 naming ``agents`` or ``collaboration`` when the request sends its
                own: a preset's collaboration is fixed (send them with a served model).
        """
        for field in ("agents", "collaboration"):
            if getattr(body, field) is not None:
                raise bad_request(
                    f"{field}: model {self.name!r} is a preset collaboration, which sets "
                    f"agents and collaboration itself; send {field} with a served model instead",
                    field,
                    "preset_field",
                )
        return body.model_copy(
            update={
                "model": self.model,
                "agents": [dict(a) for a in self.agents],
                "collaboration": CollaborationModel.model_validate(dict(self.collaboration)),
            }
        )

    def probe(self) -> ChatCompletionRequest:
        """A one-message request running this preset (``check_preset`` validates it)."""
        body = ChatCompletionRequest.model_validate(
            {"messages": [{"role": "user", "content": "preset check"}]}
        )
        return self.apply(body)


def preset_option(text: str) -> list[tuple[str, str | dict[str, Any]]]:
    """``--preset``'s value: ``NAME=FILE``, or a JSON object of ``NAME: FILE`` (or
    ``NAME: {preset}``) pairs, which is what ``--config``'s ``preset:`` mapping becomes.

    Raises:
        ValueError: neither form (argparse reports it as a usage error).
    """
    stripped = text.strip()
    if stripped.startswith("{"):
        try:
            parsed = json.loads(stripped)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--preset: not a JSON object of NAME: FILE ({exc})") from None
        if not isinstance(parsed, dict):
            raise ValueError("--preset: expected a JSON object of NAME: FILE")
        pairs: list[tuple[str, str | dict[str, Any]]] = []
        for name, value in parsed.items():
            if not isinstance(value, str | dict):
                raise ValueError(
                    f"--preset {name}: expected a file name or a preset object, "
                    f"got {type(value).__name__}"
                )
            pairs.append((str(name), value))
        return pairs
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise ValueError(f"--preset: expected NAME=FILE, got {text!r}")
    return [(name, path)]


def load_presets(specs: Iterable[Sequence[tuple[str, str | dict[str, Any]]]]) -> dict[str, Preset]:
    """The presets of ``--preset`` options (each a ``preset_option`` value), read and
    parsed by the request's schema; not yet checked against a server (``check_preset``).

    Raises:
        PresetError: a bad name, a name given twice, too many presets, or a file that is
            missing, too large, not JSON or not a preset (the message names which).
    """
    presets: dict[str, Preset] = {}
    for name, value in (pair for spec in specs for pair in spec):
        if name in presets:
            raise PresetError(f"--preset {name}: two presets are named {name!r}")
        if len(presets) >= MAX_PRESETS:
            raise PresetError(f"--preset: at most {MAX_PRESETS} presets")
        if isinstance(value, str):
            presets[name] = read_preset(name, Path(value))
        else:
            presets[name] = parse_preset(name, f"--preset {name}", value)
    return presets


def read_preset(name: str, path: Path) -> Preset:
    """The preset ``name`` in the JSON file ``path`` (at most ``MAX_PRESET_BYTES``).

    Raises:
        PresetError: the file cannot be read, is too large, is not JSON or not a preset.
    """
    source = f"--preset {name}={path}"
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_PRESET_BYTES + 1)
    except OSError as exc:
        raise PresetError(f"{source}: cannot read it ({exc.strerror or exc})") from None
    if len(raw) > MAX_PRESET_BYTES:
        raise PresetError(f"{source}: larger than {MAX_PRESET_BYTES} bytes")
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PresetError(f"{source}: not a JSON file ({exc})") from None
    return parse_preset(name, source, doc)


def parse_preset(name: str, source: str, doc: Any) -> Preset:
    """The preset ``name`` from its document ``doc`` (``source`` names it in errors).

    ``agents`` and ``collaboration`` are parsed by ``ChatCompletionRequest``, the schema a
    request's own fields meet, so a preset can hold exactly what a request can.

    Raises:
        PresetError: a bad name, or a document that is not a preset (names the field).
    """
    if not NAME_PATTERN.fullmatch(name):
        raise PresetError(
            f"{source}: the name must be 1-128 letters, digits or ._:/@+- (starting with a "
            f"letter or digit), got {name!r}"
        )
    if name in RESERVED_NAMES:
        raise PresetError(f"{source}: {name!r} already means the first served model")
    if not isinstance(doc, dict):
        raise PresetError(f"{source}: expected a JSON object with agents and collaboration")
    unknown = sorted(set(doc) - PRESET_KEYS)
    if unknown:
        raise PresetError(
            f"{source}: {unknown[0]}: unknown field (a preset has {', '.join(sorted(PRESET_KEYS))})"
        )
    for field in ("agents", "collaboration"):
        if doc.get(field) is None:
            raise PresetError(f"{source}: {field}: required")
    model, description = doc.get("model"), doc.get("description")
    if model is not None and not isinstance(model, str):
        raise PresetError(f"{source}: model: expected a served model's name")
    if description is not None and not (isinstance(description, str) and len(description) <= 512):
        raise PresetError(f"{source}: description: expected a string of at most 512 characters")
    try:
        ChatCompletionRequest.model_validate(
            {
                "messages": [{"role": "user", "content": "preset check"}],
                "agents": doc["agents"],
                "collaboration": doc["collaboration"],
            }
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        raise PresetError(
            f"{source}: {_field_path(first.get('loc', ()))}: {first.get('msg', 'invalid')}"
        ) from None
    return Preset(
        name=name,
        source=source,
        model=model,
        agents=tuple(doc["agents"]),
        collaboration=dict(doc["collaboration"]),
        description=description,
    )


def _field_path(loc: Iterable[Any]) -> str:
    """pydantic's error location as a field path (``agents[0].count``), union branch
    markers (``str``, ``list[...]``) dropped."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif str(part) in ("str", "int", "float", "bool") or str(part).startswith("list["):
            break
        else:
            path += f".{part}" if path else str(part)
    return path or "preset"
