"""A small synthetic pretraining corpus for tests that run anywhere (no ../shared needed).

Documents are blank-line-separated paragraphs of template sentences; each document keeps to one
of six topics (sailors, farmers, kings, ...), so a masked word is partly predictable from its
sentence and a random B sentence from another document often gives itself away by its topic:
both objectives have something to learn within a couple of hundred steps.
"""

from __future__ import annotations

import random
from pathlib import Path

TOPICS = (
    ("sailor", "ship", "sea", "whale", "harbour", "rope", "anchor", "captain"),
    ("farmer", "field", "cow", "barn", "wheat", "plough", "orchard", "tractor"),
    ("king", "castle", "crown", "knight", "throne", "sword", "dragon", "kingdom"),
    ("child", "school", "book", "teacher", "lesson", "chalk", "pencil", "classroom"),
    ("doctor", "patient", "fever", "medicine", "hospital", "nurse", "bandage", "surgeon"),
    ("miner", "coal", "lamp", "tunnel", "pick", "cart", "mountain", "lantern"),
)
ADJECTIVES = ("old", "young", "tired", "happy", "quiet", "brave", "small", "great")
VERBS = ("saw", "found", "carried", "loved", "watched", "left", "cleaned", "followed")
TEMPLATES = (
    "The {j} {a} {v} the {b}.",
    "A {a} {v} the {j} {b} near the {c}.",
    "Then the {a} {v} a {b} and the {c}.",
    "Every day the {j} {a} {v} the {b}.",
)


def sentence(rng: random.Random, topic: tuple[str, ...]) -> str:
    a, b, c = rng.sample(topic, 3)
    return rng.choice(TEMPLATES).format(
        j=rng.choice(ADJECTIVES), a=a, b=b, c=c, v=rng.choice(VERBS)
    )


def write_corpus(
    path: Path, documents: int, seed: int = 0, sentences: tuple[int, int] = (2, 12)
) -> Path:
    """`documents` paragraphs of sentences[0]..sentences[1] sentences, blank lines between."""
    rng = random.Random(seed)
    paragraphs = []
    for d in range(documents):
        topic = TOPICS[d % len(TOPICS)]
        paragraphs.append(" ".join(sentence(rng, topic) for _ in range(rng.randint(*sentences))))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n\n".join(paragraphs) + "\n", encoding="utf-8")
    return path


CHAIN = tuple(c + v for c in "bdfgk" for v in "aeiou")  # 25 words, one token each


def write_chain_corpus(path: Path, documents: int, seed: int = 0) -> Path:
    """Sentences that walk a fixed cycle of 25 made-up words from a random start ("Ko ku ba be
    bi."): each word names its neighbours, while no word is much more frequent than another.
    A masked word is nearly certain from context and nearly a guess without it."""
    rng = random.Random(seed)
    paragraphs = []
    for _ in range(documents):
        sentences = []
        for _ in range(rng.randint(2, 5)):
            start, n = rng.randrange(len(CHAIN)), rng.randint(5, 10)
            words = " ".join(CHAIN[(start + i) % len(CHAIN)] for i in range(n))
            sentences.append(words.capitalize() + ".")
        paragraphs.append(" ".join(sentences))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n\n".join(paragraphs) + "\n", encoding="utf-8")
    return path
