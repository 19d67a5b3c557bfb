"""The pure part of bench/lora_role.py: judge examples, held-out items never trained on."""

from __future__ import annotations

import lora_role as L


def test_held_out_questions_are_never_trained_on_and_proposals_are_balanced() -> None:
    train, held = L.split(60, 20, train_seed=99, seed=14)
    assert not {q for q, _, _ in train} & {q for q, _, _ in held}
    assert len(held) == 20 * len(L.FAMILIES) and train
    assert sum(right for _, _, right in held) == len(held) // 2
    assert L.split(60, 20, train_seed=99, seed=14) == (train, held)  # deterministic
