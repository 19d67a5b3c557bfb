"""Role definitions kept as Markdown files in a repository (like OpenHands microagents).

A role file is Markdown with a small front-matter header::

    ---
    name: reviewer
    instructions: Review the code. Say APPROVED or REJECTED.
    adapter: lora-review
    model: null
    temperature: 0.2
    max_tokens: 256
    triggers: [review, bug]
    ---
    Body text, appended to the instructions.

The header is a deliberately tiny YAML subset (``key: value``, one per line;
strings, optionally quoted; numbers; ``null``; ``[a, b]`` lists), parsed here
without a YAML dependency, with errors that name the file, the line and the field.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs

from ._errors import InvalidRole
from ._spec import AgentSpec, agent_field_rules
from .graph import Node

#: The agent fields a role file may set (their rules are ``AgentSpec``'s), plus ``triggers``.
_AGENT_FIELDS = tuple(name for name in agent_field_rules() if name != "role")
_FIELDS = {*_AGENT_FIELDS, "triggers"}
_KEY = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\s*:\s*(.*)$")


@attrs.frozen
class RoleDefinition(AgentSpec):
    """One role loaded from a Markdown file: an ``AgentSpec`` with its triggers and source.

    Attributes:
        instructions: the header's instructions followed by the file's body.
        triggers: lower-case keywords that select this role (``match_roles``).
        path: the file it came from ("" when built in code).
    """

    triggers: tuple[str, ...] = ()
    path: str = ""

    def to_agent_spec(self, **overrides: Any) -> AgentSpec:
        """The ``AgentSpec`` of this role (``overrides`` replace fields, e.g. ``count=3``)."""
        fields: dict[str, Any] = {key: getattr(self, key) for key in _AGENT_FIELDS}
        return AgentSpec(**{**fields, "role": self.name, **overrides})

    def to_node(self, **overrides: Any) -> Node:
        """A graph ``Node`` of this role (``overrides`` e.g. ``count=2, join=True``)."""
        return Node.from_spec(self, **overrides)


def _scalar(raw: str) -> Any:
    raw = raw.strip()
    if raw in ("", "null", "~", "None"):
        return None
    if raw in ("true", "false"):
        return raw == "true"
    if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "'\"":
        return raw[1:-1]
    if raw.startswith("[") and raw.endswith("]"):
        inner = raw[1:-1].strip()
        return [] if not inner else [_scalar(x) for x in inner.split(",")]
    for cast in (int, float):
        try:
            return cast(raw)
        except ValueError:
            pass
    return raw


def parse_role(text: str, path: str = "<string>") -> RoleDefinition:
    """Parse one role file's text (``path`` is used in error messages)."""
    lines = text.splitlines()
    if not lines or lines[0].strip() != "---":
        raise InvalidRole(path, None, "must start with a '---' front-matter header")
    try:
        end = next(i for i in range(1, len(lines)) if lines[i].strip() == "---")
    except StopIteration:
        raise InvalidRole(path, None, "the front-matter header is not closed by '---'") from None
    header: dict[str, Any] = {}
    for lineno in range(1, end):
        line = lines[lineno]
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = _KEY.match(line.strip())
        if m is None:
            raise InvalidRole(
                path, None, f"line {lineno + 1}: expected 'key: value', got {line.strip()!r}"
            )
        key, value = m.group(1), m.group(2)
        if key not in _FIELDS:
            raise InvalidRole(
                path, key, f"unknown field (line {lineno + 1}); known: {sorted(_FIELDS)}"
            )
        if key in header:
            raise InvalidRole(path, key, f"given twice (line {lineno + 1})")
        quoted = value.strip()[:1] in ("'", '"')
        # instructions are prose: never read as a number or a list unless quoted
        header[key] = value.strip() if key == "instructions" and not quoted else _scalar(value)
    body = "\n".join(lines[end + 1 :]).strip()
    return _definition(header, body, path)


def _definition(header: Mapping[str, Any], body: str, path: str) -> RoleDefinition:
    name = header.get("name")
    if not isinstance(name, str) or not name.strip():
        raise InvalidRole(path, "name", "is required and must be a non-empty string")

    rules = agent_field_rules()
    for key in _AGENT_FIELDS:
        reason = rules[key].problem(header.get(key, attrs.fields_dict(AgentSpec)[key].default))
        if reason is not None:
            raise InvalidRole(path, key, reason)
    triggers = header.get("triggers") or []
    if isinstance(triggers, str):
        triggers = [triggers]
    if not isinstance(triggers, list) or not all(
        isinstance(t, str) and t.strip() for t in triggers
    ):
        raise InvalidRole(path, "triggers", f"must be a list of words, got {triggers!r}")
    instructions = "\n\n".join(x for x in (header.get("instructions") or "", body) if x)
    fields = {
        key: header[key] for key in _AGENT_FIELDS if key in header and header[key] is not None
    }
    return RoleDefinition(
        **{**fields, "name": name.strip(), "instructions": instructions},
        triggers=tuple(t.strip().lower() for t in triggers),
        path=path,
    )


def load_role(path: str | Path) -> RoleDefinition:
    """Load one role file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidRole(str(p), None, f"cannot be read: {exc}") from None
    return parse_role(text, str(p))


def load_roles(folder: str | Path) -> dict[str, RoleDefinition]:
    """Load every ``*.md`` role file of ``folder`` (sorted by file name), keyed by role name.

    Raises:
        InvalidRole: a file is invalid, or two files define the same name.
    """
    root = Path(folder)
    if not root.is_dir():
        raise InvalidRole(str(root), None, "is not a folder")
    roles: dict[str, RoleDefinition] = {}
    for file in sorted(root.glob("*.md")):
        role = load_role(file)
        if role.name in roles:
            raise InvalidRole(
                str(file), "name", f"{role.name!r} is already defined in {roles[role.name].path}"
            )
        roles[role.name] = role
    return roles


def match_roles(
    text: str, roles: Mapping[str, RoleDefinition] | Iterable[RoleDefinition]
) -> list[RoleDefinition]:
    """The roles with a trigger keyword in ``text`` (whole words, any case), in the given order."""
    defs = list(roles.values()) if isinstance(roles, Mapping) else list(roles)
    words = set(re.findall(r"[\w-]+", text.lower()))
    lowered = text.lower()
    out = []
    for role in defs:
        for trigger in role.triggers:
            hit = trigger in words if re.fullmatch(r"[\w-]+", trigger) else trigger in lowered
            if hit:
                out.append(role)
                break
    return out
