"""The preset file: a chosen configuration under a name, as ``serve --preset NAME=FILE`` loads it.

Format (JSON): ``{"name": str, "agents": [...], "collaboration": {...}}``, the
request fields of the published quality files under a name. A request whose
``model`` is the preset's name runs it (issue 39). The per-item choices are not
part of it: a client still sends ``collaboration.answer.choices`` on a closed
question.
"""

from __future__ import annotations

import json
from pathlib import Path

from ._candidates import Candidate, JSONObject


def preset_of(candidate: Candidate) -> JSONObject:
    """The preset document of ``candidate`` (its free-answer fields: the general form)."""
    return {
        "name": candidate.name,
        "agents": list(candidate.free.agents),
        "collaboration": dict(candidate.free.collaboration),
    }


def write_preset(candidate: Candidate, path: Path) -> Path:
    """Write ``candidate``'s preset to ``path`` and return it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(preset_of(candidate), indent=2) + "\n", encoding="utf-8")
    return path
