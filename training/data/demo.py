"""Small, generated, clearly-labelled DEMO data for the built-in default models.

Templated sentiment sentences, sentences with person / place / organisation names from short
lists, and short question/context pairs. Enough to turn all-MiniLM-L6-v2 into demo heads in a
few minutes on a laptop CPU; not a benchmark and not a substitute for real data (fine-tune on
SST-2, CoNLL-2003 or SQuAD for that: see the README).

    python -m training.data.demo --out runs/demo-data     # writes the three files below

Formats are the ones `training.finetune` reads: classification and token-classification JSONL,
question answering as SQuAD v1.1 JSON.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

PERSONS = [
    "Angela Merkel",
    "Maria",
    "John Smith",
    "Emma Watson",
    "Barack Obama",
    "Marie Curie",
    "Pedro Alvarez",
    "Yuki Tanaka",
    "Olivia Brown",
    "Ahmed Hassan",
    "Li Wei",
    "Sofia Rossi",
    "Lucas Martin",
    "Anna Kowalski",
    "David Miller",
    "Fatima Zahra",
    "Hans Becker",
    "Ines Costa",
    "Tom Hanks",
    "Nadia Petrova",
    "Carlos Mendes",
    "Elena",
    "James",
    "Priya Sharma",
    "Kenji",
]
PLACES = [
    "Paris",
    "Lisbon",
    "Porto",
    "Berlin",
    "London",
    "Madrid",
    "Rome",
    "Tokyo",
    "New York",
    "Cairo",
    "Warsaw",
    "Vienna",
    "Chicago",
    "Sydney",
    "Toronto",
    "Mumbai",
    "Nairobi",
    "Oslo",
    "Prague",
    "Brazil",
    "Germany",
    "France",
    "Japan",
    "Canada",
    "Kenya",
    "Italy",
]
ORGS = [
    "Google",
    "the United Nations",
    "Siemens",
    "Microsoft",
    "the BBC",
    "Toyota",
    "Reuters",
    "the World Bank",
    "Airbus",
    "Nokia",
    "Amazon",
    "the Red Cross",
    "Volkswagen",
    "Unilever",
]
# Templates: {P} person, {L} place, {O} organisation.
NER_TEMPLATES = [
    "{P} visited {L} last week .",
    "{P} lives in {L} .",
    "{P} works for {O} in {L} .",
    "{O} opened a new office in {L} .",
    "Yesterday {P} met {P2} in {L} .",
    "{P} joined {O} in 2019 .",
    "The CEO of {O} , {P} , spoke in {L} on Monday .",
    "{P} flew from {L} to {L2} .",
    "According to {O} , prices in {L} rose again .",
    "{P} said the meeting in {L} went well .",
    "{L} is where {P} grew up .",
    "Shares of {O} fell after {P} resigned .",
]
GOOD = ["loved", "enjoyed", "adored", "was delighted by", "really liked", "was moved by"]
BAD = [
    "hated",
    "disliked",
    "was bored by",
    "regretted watching",
    "could not stand",
    "was annoyed by",
]
GOOD_ADJ = ["wonderful", "brilliant", "great", "beautiful", "excellent", "charming", "superb"]
BAD_ADJ = ["terrible", "awful", "boring", "dull", "horrible", "disappointing", "bad"]
THINGS = ["film", "movie", "book", "show", "restaurant", "album", "play", "meal", "hotel", "game"]
SENTIMENT_TEMPLATES = [
    ("I {V} this {T}", None),
    ("We {V} the {T}", None),
    ("This {T} was {A}", "adj"),
    ("What a {A} {T} !", "adj"),
    ("The {T} is {A} and I would say so again", "adj"),
    ("Honestly , the {T} was {A}", "adj"),
    ("My friend {V} this {T}", None),
]
QA_TEMPLATES = [
    # (context, [(question, answer-slot)])
    (
        "{P} lives in {L} and works in {L2} .",
        [("Where does {P} live?", "L"), ("Where does {P} work?", "L2"), ("Who lives in {L}?", "P")],
    ),
    (
        "{P} was born in {L} in 1980 and moved to {L2} later .",
        [("Where was {P} born?", "L"), ("Where did {P} move to?", "L2")],
    ),
    (
        "{O} is based in {L} . Its chief executive is {P} .",
        [("Where is {O} based?", "L"), ("Who is the chief executive of {O}?", "P")],
    ),
    (
        "{P} works for {O} . The company sent {P} to {L} last year .",
        [("Who does {P} work for?", "O"), ("Where was {P} sent?", "L")],
    ),
    (
        "Last summer {P} travelled to {L} with a friend from {L2} .",
        [("Where did {P} travel to?", "L"), ("Where is the friend from?", "L2")],
    ),
]


def _fill(template: str, rng: random.Random) -> tuple[str, dict[str, str]]:
    p, p2 = rng.sample(PERSONS, 2)
    loc, loc2 = rng.sample(PLACES, 2)
    slots = {"P": p, "P2": p2, "L": loc, "L2": loc2, "O": rng.choice(ORGS)}
    return template.format(**slots), slots


def sentiment_examples(n: int, rng: random.Random) -> list[dict]:
    rows = []
    for i in range(n):
        label = "positive" if i % 2 == 0 else "negative"
        template, kind = rng.choice(SENTIMENT_TEMPLATES)
        if kind == "adj":
            word = rng.choice(GOOD_ADJ if label == "positive" else BAD_ADJ)
            text = template.format(A=word, T=rng.choice(THINGS))
        else:
            word = rng.choice(GOOD if label == "positive" else BAD)
            text = template.format(V=word, T=rng.choice(THINGS))
        rows.append({"text": text, "label": label})
    return rows


def ner_examples(n: int, rng: random.Random) -> list[dict]:
    """Word-level IOB2 tags; multi-word names get B- then I-."""
    rows = []
    for _ in range(n):
        template = rng.choice(NER_TEMPLATES)
        _, slots = _fill(template, rng)
        tokens: list[str] = []
        tags: list[str] = []
        for piece in template.split():
            kind = {"{P}": "PER", "{P2}": "PER", "{L}": "LOC", "{L2}": "LOC", "{O}": "ORG"}.get(
                piece
            )
            if kind is None:
                tokens.append(piece)
                tags.append("O")
                continue
            words = slots[piece.strip("{}")].split()
            if words[0] == "the":  # "the BBC": the article is not part of the name
                tokens.append("the")
                tags.append("O")
                words = words[1:]
            for j, w in enumerate(words):
                tokens.append(w)
                tags.append(("B-" if j == 0 else "I-") + kind)
        rows.append({"tokens": tokens, "tags": tags})
    return rows


def qa_examples(n: int, rng: random.Random) -> dict:
    """SQuAD v1.1 JSON: one paragraph per generated context."""
    paragraphs = []
    for i in range(n):
        context_t, questions = rng.choice(QA_TEMPLATES)
        context, slots = _fill(context_t, rng)
        qas = []
        for j, (question_t, slot) in enumerate(questions):
            answer = slots[slot]
            qas.append(
                {
                    "id": f"demo-{i}-{j}",
                    "question": question_t.format(**slots),
                    "answers": [{"text": answer, "answer_start": context.index(answer)}],
                }
            )
        paragraphs.append({"context": context, "qas": qas})
    return {"version": "demo", "data": [{"title": "demo", "paragraphs": paragraphs}]}


def write_demo_data(out: Path, seed: int = 0, n: int = 1200) -> dict[str, Path]:
    """Writes train and eval files for the three demo heads; returns their paths by name."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, split_seed, size in (("train", seed, n), ("eval", seed + 1, n // 6)):
        rng = random.Random(split_seed)
        sentiment = out / f"sentiment.{split}.jsonl"
        sentiment.write_text("".join(json.dumps(r) + "\n" for r in sentiment_examples(size, rng)))
        ner = out / f"ner.{split}.jsonl"
        ner.write_text("".join(json.dumps(r) + "\n" for r in ner_examples(size, rng)))
        qa = out / f"qa.{split}.json"
        qa.write_text(json.dumps(qa_examples(size // 2, rng)))
        paths |= {f"sentiment.{split}": sentiment, f"ner.{split}": ner, f"qa.{split}": qa}
    return paths


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", type=Path, required=True, help="folder for the generated files")
    ap.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    ap.add_argument("-n", type=int, default=1200, help="training examples per task (default 1200)")
    args = ap.parse_args(argv)
    for name, path in write_demo_data(args.out, args.seed, args.n).items():
        print(f"{name:>16}: {path}")


if __name__ == "__main__":
    main()
