"""microagent.evaluation: which collaboration, if any, pays for its tokens on your questions.

``evaluate`` runs greedy and candidate configurations over a JSONL of questions,
chooses on a selection part and reports on a held-out part (``docs/eval.md``).
"""

from __future__ import annotations
