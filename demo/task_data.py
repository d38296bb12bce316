"""Generated DEMO data for the task packages: a reranker and an NLI model for zero-shot labels,
built from the QA grammar of the demo heads (demo/qa_data.py).

- rerank: (question, passage) pairs from the QA paragraphs of `demo.qa_data`: the passage that
  holds the answer is relevant; the paragraph's other sentences (same subject, other facts) and
  sentences of other paragraphs are not;
- nli: (premise, hypothesis) pairs labelled entailment or contradiction (a two-label NLI
  model: zero-shot reads only those two), where each hypothesis is a topic in a template
  ("This text is about {}."): a paragraph entails its own topic and contradicts the others.

The format is the one `training.finetune` reads: JSONL with sentence1 / sentence2 / label. Not a benchmark: these heads learn the templates' world.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

from demo.qa_data import KINDS, paragraph

RERANK_LABELS = ["irrelevant", "relevant"]  # two labels: /rerank scores the second's probability
NLI_LABELS = ["contradiction", "entailment"]  # entailment second, where the reranker has relevant

# The topic of each QA paragraph kind, in the words a user would pick as labels.
TOPICS = {
    "building": ["buildings", "architecture"],
    "person": ["a person", "people"],
    "company": ["business", "a company"],
    "event": ["an event", "events"],
}
TEMPLATES = ["This example is about {}.", "This text is about {}.", "The topic is {}."]

SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9$£€])")


def sentences(text: str) -> list[tuple[int, str]]:
    """(start, sentence) of each sentence of a generated paragraph."""
    out, start = [], 0
    for piece in SENTENCE_END.split(text):
        start = text.index(piece, start)
        out.append((start, piece))
        start += len(piece)
    return out


def rerank_examples(n: int, rng: random.Random) -> list[dict]:
    """n pairs, a third relevant: each question with the sentence that answers it, a sentence
    of its own paragraph that does not, and one from another paragraph."""
    rows: list[dict] = []
    previous: list[tuple[int, str]] = []
    while len(rows) < n:
        context, questions = paragraph(rng)
        parts = sentences(context)
        for question, answer, start in questions:
            hit = next(s for s0, s in parts if s0 <= start < s0 + len(s))
            others = [s for _, s in parts if s != hit and answer not in s]
            negatives = [rng.choice(others)] if others else []
            if previous:
                negatives.append(rng.choice(previous)[1])
            rows.append({"sentence1": question, "sentence2": hit, "label": "relevant"})
            rows += [
                {"sentence1": question, "sentence2": s, "label": "irrelevant"} for s in negatives
            ]
        previous = parts
    rng.shuffle(rows)
    return rows[:n]


def nli_examples(n: int, rng: random.Random) -> list[dict]:
    """n (premise, hypothesis) pairs: the first sentences of a paragraph entail its topic in a
    template and contradict another topic in the same template (only the label tells the two
    apart). Topics only: review verdicts, tried beside them, stayed at chance (0.50-0.52) after
    two passes, and no neutral rows: with hypotheses of the other kind as neutral, a short run
    learned to tell the kinds apart and nothing else."""
    rows: list[dict] = []
    while len(rows) < n:
        kind = rng.choice(KINDS)
        parts = [s for _, s in sentences(paragraph(rng, kind)[0])]
        premise = " ".join(parts[: rng.randint(1, 2)])
        wrong = [w for key, words in TOPICS.items() if key != kind for w in words]
        template = rng.choice(TEMPLATES)
        rows.append({"sentence1": premise, "sentence2": template.format(rng.choice(TOPICS[kind])),
                     "label": "entailment"})  # fmt: skip
        rows.append({"sentence1": premise, "sentence2": template.format(rng.choice(wrong)),
                     "label": "contradiction"})  # fmt: skip
    rng.shuffle(rows)
    return rows[:n]


def write_task_data(
    out: Path, seed: int = 0, sizes: dict[str, int] | None = None
) -> dict[str, Path]:
    """Writes rerank.train.jsonl and nli.train.jsonl; returns their paths."""
    sizes = {"rerank": 1500, "nli": 1500, **(sizes or {})}
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed + 1000)  # not the demo heads' stream: other sentences
    paths = {"rerank.train": out / "rerank.train.jsonl", "nli.train": out / "nli.train.jsonl"}
    for name, rows in (("rerank.train", rerank_examples(sizes["rerank"], rng)),
                       ("nli.train", nli_examples(sizes["nli"], rng))):  # fmt: skip
        paths[name].write_text("".join(json.dumps(r) + "\n" for r in rows))
    return paths
