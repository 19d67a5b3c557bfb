"""Role definitions in Markdown files: parsing, loading a folder, trigger matching."""

from __future__ import annotations

from pathlib import Path

import pytest
from microagent.collab import AgentSpec, InvalidRole, load_roles
from microagent.collab._role_files import match_roles, parse_role

DEMO_ROLES = Path(__file__).resolve().parent.parent / "demos" / "roles"

REVIEWER = """---
name: reviewer
instructions: Review the code. Say APPROVED or REJECTED.
adapter: lora-a
model: null
temperature: 0.2
max_tokens: 128
triggers: [review, Bug]
---
Be brief.
"""


def test_parse_role_and_agent_spec() -> None:
    role = parse_role(REVIEWER, "reviewer.md")
    assert role.name == "reviewer" and role.adapter == "lora-a" and role.model is None
    assert role.instructions == "Review the code. Say APPROVED or REJECTED.\n\nBe brief."
    assert role.triggers == ("review", "bug")
    spec = role.to_agent_spec(count=2)
    assert spec == AgentSpec(
        "reviewer",
        count=2,
        instructions=role.instructions,
        adapter="lora-a",
        temperature=0.2,
        max_tokens=128,
        role="reviewer",
    )
    node = role.to_node(join=True)
    assert node.join and node.instructions == role.instructions


@pytest.mark.parametrize(
    ("text", "field", "fragment"),
    [
        ("name: x\n", None, "front-matter"),
        ("---\nname: x\n", None, "not closed"),
        ("---\ninstructions: hi\n---\n", "name", "required"),
        ("---\nname: x\ncolour: red\n---\n", "colour", "unknown field"),
        ("---\nname: x\ntemperature: hot\n---\n", "temperature", "number"),
        ("---\nname: x\ntemperature: 3\n---\n", "temperature", "number"),
        ("---\nname: x\nmax_tokens: 1.5\n---\n", "max_tokens", "integer"),
        ("---\nname: x\ntriggers: 5\n---\n", "triggers", "list"),
        ("---\nname: x\nname: y\n---\n", "name", "twice"),
        ("---\nname: x\njust words\n---\n", None, "key: value"),
    ],
)
def test_errors_name_the_file_and_field(text: str, field: str | None, fragment: str) -> None:
    with pytest.raises(InvalidRole) as info:
        parse_role(text, "roles/bad.md")
    assert info.value.path == "roles/bad.md" and info.value.field == field
    assert "roles/bad.md" in str(info.value) and fragment in str(info.value)


def test_load_folder_and_match(tmp_path: Path) -> None:
    roles = load_roles(DEMO_ROLES)
    assert set(roles) == {"planner", "coder", "reviewer"}
    assert [r.name for r in match_roles("Please REVIEW this bug fix", roles)] == ["reviewer"]
    assert [r.name for r in match_roles("plan and implement it", roles)] == [
        "coder",
        "planner",
    ]  # file-name order
    assert match_roles("reviewing", roles) == []  # whole words only
    (tmp_path / "a.md").write_text(REVIEWER)
    (tmp_path / "b.md").write_text(REVIEWER)
    with pytest.raises(InvalidRole, match="already defined"):
        load_roles(tmp_path)
    with pytest.raises(InvalidRole, match="not a folder"):
        load_roles(tmp_path / "missing")
