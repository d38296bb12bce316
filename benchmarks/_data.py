"""Real texts for the serving benchmark, read from ../shared/data beside the repository, and
what each request becomes: the HTTP body, the model rows the service will cut from it, and the
same input in the shape the transformers pipeline takes.

SST-2 dev sentences for classification and embedding, CoNLL-2003 dev (eng.testa) sentences for
NER, SQuAD v1.1 dev question/context pairs for QA. Shuffled once with a fixed seed, lengths as
they come: long contexts are windowed by the service as they would be for a user.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from heads.package import ModelPackage
from heads.rows import ModelRow, load_package_tokenizer
from heads.tasks import classify, embed, ner, qa
from training.data.classification import read_classification
from training.data.squad import read_squad
from training.data.token_classification import read_tagged

SST2_LABELS = ["negative", "positive"]  # SST-2's 0 / 1
CONLL_LABELS = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]
ENDPOINTS = {
    "classification": "/classify",
    "token-classification": "/ner",
    "question-answering": "/qa",
    "embedding": "/embed",
}
# The /qa default max_seq_len (its stride default is qa.default_stride), so the in-process runs
# cut the same rows.
QA_MAX_SEQ_LEN = 384
SEED = 0


def shared_data(path: Path | None = None) -> Path:
    """../shared/data relative to the repository, or `path`; exits with a message if absent."""
    root = path or Path(__file__).resolve().parents[1].parent / "shared" / "data"
    if not (root / "sst2" / "dev.tsv").is_file():
        raise SystemExit(
            f"error: no benchmark data at {root} (SST-2, CoNLL-2003, SQuAD from ../shared/data); "
            "pass --data DIR pointing at a copy"
        )
    return root


@dataclass(frozen=True)
class Item:
    """One request of the workload.

    body: the JSON the load generator posts; rows: the model rows the service cuts from it;
    peer: the input as the transformers pipeline takes it; label: gold label (SST-2) or None;
    prepared: the task's preprocess result where its postprocess needs it (QA).
    """

    body: dict[str, Any]
    rows: list[ModelRow]
    peer: Any
    label: str | None = None
    prepared: Any = None

    @property
    def tokens(self) -> int:
        return sum(len(r) for r in self.rows)


def texts(task: str, data: Path) -> list[tuple[Any, str | None]]:
    """(input, gold label or None) per example, shuffled with a fixed seed."""
    if task in ("classification", "embedding"):
        examples = [(e.text, e.label) for e in read_classification(data / "sst2" / "dev.tsv")]
        gold = {"0": SST2_LABELS[0], "1": SST2_LABELS[1]}
        out: list[tuple[Any, str | None]] = [(t, gold.get(g)) for t, g in examples]
    elif task == "token-classification":
        sentences = read_tagged(data / "conll2003" / "iob2" / "eng.testa")
        out = [(" ".join(s.words), None) for s in sentences]
    elif task == "question-answering":
        out = [
            ((e.question, e.context), None) for e in read_squad(data / "squad" / "dev-v1.1.json")
        ]
    else:
        raise ValueError(f"unknown task {task!r}")
    random.Random(SEED).shuffle(out)
    return out


def workload(package: ModelPackage, data: Path, limit: int | None = None) -> list[Item]:
    """The requests for `package`'s task, with the rows the service's own preprocess cuts."""
    tok = load_package_tokenizer(package.tokenizer_path)
    task, max_len = package.task, package.max_seq_length
    items = []
    for x, label in texts(package.task, data)[:limit]:
        if task == "classification":
            rows = classify.preprocess(tok, [x], max_len).sequences
            items.append(Item({"inputs": x}, rows, x, label))
        elif task == "embedding":
            rows = embed.preprocess(tok, [x], max_len).sequences
            items.append(Item({"inputs": x}, rows, x, label))
        elif task == "token-classification":
            rows = ner.preprocess(tok, x, max_len, ner.default_stride(max_len)).sequences
            body = {"inputs": x, "aggregation_strategy": "simple"}
            items.append(Item(body, rows, x))
        else:
            question, context = x
            seq = min(QA_MAX_SEQ_LEN, max_len)
            prepared = qa.preprocess(tok, question, context, seq, qa.default_stride(seq))
            body = {"question": question, "context": context}
            items.append(Item(body, prepared.sequences, body, None, prepared))
    return items
