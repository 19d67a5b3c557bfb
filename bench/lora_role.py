"""A role-level LoRA for the default model: a judge adapter vs the same judge by instructions.

The judge role reads a closed question and a proposed answer and says whether it
is correct ("yes"/"no"), as ``best_of``'s self-judge does. Two judges are compared
on the same held-out items of ``bench/_quality_tasks.py`` (the quality
benchmark's items, ``--seed``; half the proposals right, half wrong):

- ``instructions``: the base model with the judge's instructions only;
- ``lora``: the same prompt through a LoRA adapter (peft) trained here, on this
  CPU, on other items of the same families (``--train-seed``): the adapter
  learns the role *and* these families, which is what a role adapter is for; the
  items it is scored on are not among those it saw (checked).

Scored with transformers on CPU (the judge's P(yes) vs P(no) at the answer's
first position; accuracy at the 0.5 threshold and the rank AUC). Costs reported:
training seconds, adapter size, the seconds per judged item with and without the
adapter here. (Served by vLLM, a LoRA request is about 10× slower on this CPU
and shares no KV with the base model: DESIGN.md.)

Usage: ``.venv/bin/python bench/lora_role.py [--train 400] [--eval 40] [--steps 120]
[--out lora_role]``. Writes ``bench/results/<out>.json`` and ``<out>_tables.md``;
the adapter goes to ``bench/results/<out>_adapter/`` (not committed).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _accuracy_tasks import Item  # noqa: E402
from _quality_tasks import FAMILIES, family_items  # noqa: E402
from _sections import FamilyReport, Headline, data_line, date_cell, page, publish  # noqa: E402

RESULTS = HERE / "results"
MODEL = Path.home() / ".cache" / "microagent" / "models" / "SmolLM2-135M-Instruct"
JUDGE = "Proposed answer: {answer}. Is the proposed answer correct? Answer yes or no."


def judged(items: list[Item]) -> list[tuple[str, str, bool]]:
    """(question, proposed answer, is it right): the right answer on even items, else the other."""
    out = []
    for i, item in enumerate(items):
        right = i % 2 == 0
        wrong = next(c for c in item.choices if c != item.answer)
        out.append((item.question, item.answer if right else wrong, right))
    return out


def split(n_train: int, n_eval: int, train_seed: int, seed: int) -> tuple[list[Any], list[Any]]:
    """Training and held-out judge examples over every family; held-out questions unseen."""
    held = [it for f in FAMILIES for it in family_items(f, n_eval, seed)]
    seen = {it.question for it in held}
    train = [
        it
        for f in FAMILIES
        for it in family_items(f, n_train, train_seed)
        if it.question not in seen
    ]
    return judged(train), judged(held)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train", type=int, default=400, help="training items per family")
    ap.add_argument("--eval", type=int, default=40, help="held-out items per family")
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=14, help="held-out items (the quality bench's)")
    ap.add_argument("--train-seed", type=int, default=99)
    ap.add_argument("--update", action="store_true", help="rewrite the family page and row")
    ap.add_argument("--out", default="lora_role")
    args = ap.parse_args()

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    tok = AutoTokenizer.from_pretrained(MODEL)
    base = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32)
    yes, no = (tok.encode(w, add_special_tokens=False)[0] for w in ("yes", "no"))
    train, held = split(args.train, args.eval, args.train_seed, args.seed)

    def prompt(question: str, answer: str) -> list[int]:
        messages = [
            {"role": "user", "content": question},
            {"role": "user", "content": JUDGE.format(answer=answer)},
        ]
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
        return list(ids if isinstance(ids, list) else ids["input_ids"])

    def p_yes(model: Any, rows: list[tuple[str, str, bool]]) -> tuple[list[float], float]:
        model.eval()
        out, t0 = [], time.monotonic()
        with torch.no_grad():
            for q, a, _ in rows:
                logits = model(torch.tensor([prompt(q, a)])).logits[0, -1]
                pair = torch.stack([logits[yes], logits[no]]).softmax(-1)
                out.append(float(pair[0]))
        return out, (time.monotonic() - t0) / len(rows)

    def scores(ps: list[float]) -> dict[str, float]:
        truth = [r for _, _, r in held]
        acc = sum((p > 0.5) == t for p, t in zip(ps, truth, strict=True)) / len(ps)
        pos = [p for p, t in zip(ps, truth, strict=True) if t]
        neg = [p for p, t in zip(ps, truth, strict=True) if not t]
        auc = sum((a > b) + 0.5 * (a == b) for a in pos for b in neg) / (len(pos) * len(neg))
        return {"accuracy": acc, "auc": auc, "mean_p_yes": sum(ps) / len(ps)}

    before, base_s = p_yes(base, held)
    lora = get_peft_model(
        base,
        LoraConfig(r=args.rank, lora_alpha=2 * args.rank, target_modules=["q_proj", "v_proj"]),
    )
    optim = torch.optim.AdamW([p for p in lora.parameters() if p.requires_grad], lr=args.lr)
    lora.train()
    t0 = time.monotonic()
    gen = torch.Generator().manual_seed(0)
    losses = []
    for step in range(args.steps):
        batch = [train[int(i)] for i in torch.randint(len(train), (args.batch,), generator=gen)]
        loss = torch.zeros(())
        for q, a, right in batch:  # the loss of the verdict's token only
            logits = lora(torch.tensor([prompt(q, a)])).logits[0, -1]
            target = torch.tensor(yes if right else no)
            loss = loss + torch.nn.functional.cross_entropy(logits[None], target[None])
        loss = loss / len(batch)
        optim.zero_grad()
        loss.backward()
        optim.step()
        losses.append(loss.item())
        if step % 25 == 0:
            print(f"step {step} loss {losses[-1]:.3f}", flush=True)
    train_s = time.monotonic() - t0
    after, lora_s = p_yes(lora, held)
    adapter_dir = RESULTS / f"{args.out}_adapter"
    lora.save_pretrained(adapter_dir)
    size = sum(f.stat().st_size for f in adapter_dir.rglob("*") if f.is_file())
    data = {
        "settings": {**vars(args), "families": list(FAMILIES), "judge": JUDGE},
        "train_examples": len(train),
        "held_out_examples": len(held),
        "instructions": {**scores(before), "seconds_per_item": base_s},
        "lora": {**scores(after), "seconds_per_item": lora_s},
        "train_seconds": train_s,
        "adapter_bytes": size,
        "loss_first_last": [losses[0], losses[-1]] if losses else [],
        "cpus": os.cpu_count(),
        "loadavg_at_end": os.getloadavg()[0],
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(data, indent=1))
    text = tables(data)
    (RESULTS / f"{args.out}_tables.md").write_text(text)
    print(text)
    if args.update and args.out == "lora_role":
        publish(HERE.parent, family_report())
    return 0


def tables(data: dict[str, Any]) -> str:
    """The judges' table, every number from ``data`` (this script's JSON)."""
    s = data["settings"]
    lines = [
        f"Judge role on {data['held_out_examples']} held-out items ({s['eval']} per family of "
        f"{', '.join(s['families'])}; half the proposals right), trained on "
        f"{data['train_examples']} other items for {s['steps']} steps of {s['batch']} (LoRA "
        f"r={s['rank']} on q/v, lr {s['lr']}) in {data['train_seconds']:.0f} s on "
        f"{data['cpus']} CPUs; adapter {data['adapter_bytes'] / 1e6:.1f} MB.",
        "",
        "| judge | accuracy | AUC | mean P(yes) | s / item (transformers, CPU) |",
        "|---|---|---|---|---|",
    ]
    for name in ("instructions", "lora"):
        e = data[name]
        lines.append(
            f"| {name} | {e['accuracy']:.3f} | {e['auc']:.3f} | {e['mean_p_yes']:.3f} | "
            f"{e['seconds_per_item']:.3f} |"
        )
    return "\n".join(lines) + "\n"


def family_report(results: Path = RESULTS) -> FamilyReport:
    """The LoRA-role page and headline, from ``lora_role.json`` in ``results``."""
    data = json.loads((results / "lora_role.json").read_text())
    lora, plain = data["lora"], data["instructions"]
    return FamilyReport(
        family="lora_role",
        title="A judge role as a LoRA adapter",
        headline=Headline(
            figure="judge accuracy on held-out items, LoRA adapter",
            value=f"{lora['accuracy']:.3f} (AUC {lora['auc']:.3f})",
            baseline=f"the same judge by instructions: {plain['accuracy']:.3f}",
            target="none (a probe)",
            machine=f"{data['cpus']} CPUs, load {data['loadavg_at_end']:.2f} at the end",
            date=date_cell({}),
        ),
        summary=(
            f"A judge adapter trained on this CPU in {data['train_seconds']:.0f} s scores "
            f"{lora['accuracy']:.3f} on {data['held_out_examples']} held-out items where the "
            f"base model judging by instructions scores {plain['accuracy']:.3f}."
        ),
        page=page(
            "A judge role as a LoRA adapter vs by instructions (`bench/lora_role.py`)",
            __doc__,
            [("Results", tables(data) + "\n" + data_line("lora_role.json"))],
        ),
    )


if __name__ == "__main__":
    sys.exit(main())
