"""Published checkpoints' own files, served equal to transformers (issue 46): for every family,
its most used checkpoints' config.json and tokenizer files as published (tests/published/,
shrunk where a vocabulary is megabytes: README.md there), tiny random weights of each head,
exported by training.export, served by the real app, and compared with the transformers
pipeline or AutoModel that loads the same folder with AutoTokenizer.from_pretrained.

The matrix (tests/published/checkpoints.MATRIX): bert-base-uncased / -cased, a classifier whose
tokenizer has 30,500 of its 30,522 rows, distilbert-base-uncased and its SST-2 fine-tune (a
vocab.txt and no tokenizer.json), electra-base-discriminator, roberta-base, xlm-roberta-base,
camembert-base (`<s>` 5, `</s>` 6), albert-base-v2, deberta-v3-base (99 rows past its
tokenizer), ModernBERT-base, mpnet-base (vocab.txt only) and all-mpnet-base-v2 (its
sentence-transformers files; `[PAD]` at 4, padding with `<pad>`, 1). Asserted: labels, entity
spans and answer spans exact and their scores within 1e-4, embeddings at cosine >= 0.99999,
fill-mask tokens, strings and sequences exact.

The cells that show what each checkpoint adds run by default; the rest of the cross product
(the same code paths on another family) is marked slow (`-m slow`), to keep the default run
near a minute and a half on two cores.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from service.settings import Settings
from tests.conftest import EXAMPLES
from tests.heads.tasks.conftest import (  # noqa: F401 (fixture, used by name)
    _one_torch_thread,
    repo_ner_sentences,
    repo_squad_pairs,
)
from tests.heads.tasks.test_ner import STRATEGIES, UNICODE_TEXTS
from tests.heads.tasks.test_qa import UNICODE_PAIRS
from tests.published.checkpoints import (
    MATRIX,
    model_type,
    published_checkpoint,
    published_package,
)
from tests.service.conftest import Service, serve
from tests.service.test_family_parity_http import same_layout_as_transformers_means

pytestmark = pytest.mark.anyio
transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

CLASSIFY_LEN = 24  # some sentences and most pairs are truncated
QA_LEN, QA_STRIDE = 96, 24  # the generated paragraphs span several windows
MIN_COSINE = 0.99999
SPACED = ["Hello  world,  from   Zürich\tand  Lisbon !", "(Anna) met 🙂 Jean-Luc Picard; ok?"]
# The cells run by default: what each checkpoint's files add (a template, a mask token and its
# lstrip, ids past the tokenizer, a vocab.txt, a pad id that is not 0, ...).
DEFAULT = {
    ("bert-base-uncased", "classification"),
    ("bert-base-uncased", "fill-mask"),
    ("bert-base-cased", "token-classification"),
    ("bert-base-uncased-30500", "classification"),
    ("distilbert-base-uncased", "question-answering"),
    ("distilbert-base-uncased-finetuned-sst-2-english", "classification"),
    ("electra-base-discriminator", "classification"),
    ("roberta-base", "question-answering"),
    ("roberta-base", "fill-mask"),
    ("xlm-roberta-base", "token-classification"),
    ("xlm-roberta-base", "fill-mask"),
    ("camembert-base", "classification"),
    ("camembert-base", "fill-mask"),
    ("albert-base-v2", "token-classification"),
    ("albert-base-v2", "fill-mask"),
    ("deberta-v3-base", "classification"),
    ("deberta-v3-base", "fill-mask"),
    ("ModernBERT-base", "token-classification"),
    ("ModernBERT-base", "embedding"),
    ("ModernBERT-base", "fill-mask"),
    ("mpnet-base", "classification"),
    ("mpnet-base", "fill-mask"),
    ("all-mpnet-base-v2", "embedding"),
}


def cells(task: str) -> list[Any]:
    """The checkpoints served for `task`, slow where not in DEFAULT."""
    return [
        pytest.param(name, id=name, marks=() if (name, task) in DEFAULT else pytest.mark.slow)
        for name, tasks in MATRIX.items()
        if task in tasks
    ]


@asynccontextmanager
async def served(tmp_path: Path, package: Path) -> AsyncIterator[Service]:
    """The real app over one package (its folder name is the model name)."""
    (tmp_path / package.name).symlink_to(package)
    async with serve(Settings(model_dir=tmp_path, intra_op_threads=1)) as s:
        yield s


async def post(service: Service, path: str, body: dict) -> Any:
    response = await service.client.post(path, json=body)
    assert response.status_code == 200, response.text
    return response.json()


def sentences() -> list[str]:
    """The shipped sentiment sentences and some prose, with spacing and Unicode oddities."""
    lines = []
    for path in sorted((EXAMPLES / "sentiment").glob("*.tsv")):
        lines += [row.split("\t")[0] for row in path.read_text().splitlines()[1:]][:14]
    prose = (EXAMPLES / "corpus" / "letters.txt").read_text(encoding="utf-8").split("\n\n")
    return lines + [p.strip() for p in prose[:4]] + SPACED + ["", "Café\u0301 😀 東京 naïve"]


@pytest.mark.parametrize("name", cells("classification"))
async def test_classify(tmp_path: Path, name: str) -> None:
    package = published_package(name, "classification", max_seq_length=CLASSIFY_LEN)
    folder = published_checkpoint(name, "classification")
    classifier = transformers.pipeline("text-classification", model=str(folder))
    texts = sentences()
    pairs = list(zip(texts[:12], texts[12:24], strict=False))
    async with served(tmp_path, package) as service:
        for inputs, hf_inputs in [
            (texts, texts),
            ([list(p) for p in pairs], [{"text": a, "text_pair": b} for a, b in pairs]),
        ]:
            body = {"inputs": inputs, "top_k": None, "model": package.name}
            ours = await post(service, "/classify", body)
            theirs = classifier(hf_inputs, top_k=None, truncation=True, max_length=CLASSIFY_LEN)
            for text, o, t in zip(inputs, ours, theirs, strict=True):
                assert [x["label"] for x in o] == [x["label"] for x in t], text
                assert [x["score"] for x in o] == pytest.approx(
                    [x["score"] for x in t], abs=1e-4
                ), text
    labels = set(json.loads((folder / "config.json").read_text())["id2label"].values())
    assert {x["label"] for x in ours[0]} == labels  # the checkpoint's own label names


@pytest.mark.parametrize("name", cells("token-classification"))
async def test_ner_every_strategy(tmp_path: Path, name: str) -> None:
    package = published_package(name, "token-classification")
    folder = published_checkpoint(name, "token-classification")
    texts = repo_ner_sentences(16) + UNICODE_TEXTS + SPACED
    found = 0
    async with served(tmp_path, package) as service:
        for strategy in STRATEGIES:
            recognizer = transformers.pipeline(
                "token-classification", model=str(folder), aggregation_strategy=strategy
            )
            body = {"inputs": texts, "aggregation_strategy": strategy, "model": package.name}
            ours = await post(service, "/ner", body)
            key = "entity" if strategy == "none" else "entity_group"
            for text, o in zip(texts, ours, strict=True):
                t = recognizer(text)
                assert [(e[key], e["start"], e["end"]) for e in o] == [
                    (e[key], e["start"], e["end"]) for e in t
                ], (strategy, text)
                assert [e["score"] for e in o] == pytest.approx(
                    [float(e["score"]) for e in t], abs=1e-4
                ), (strategy, text)
                assert all(e["word"] == text[e["start"] : e["end"]] for e in o)
                found += len(o)
    assert found > 50, found  # the random model does name things


def qa_pairs() -> list[tuple[str, str]]:
    """Three of examples/data/qa's questions, then twelve of the demo's generated questions,
    each asked of its paragraph and the two after it (two to four windows of QA_LEN)."""
    shipped = repo_squad_pairs(100)
    generated = shipped[-36:]
    return shipped[:3] + [
        (generated[i][0], " ".join(c for _, c in generated[i : i + 3])) for i in range(0, 36, 3)
    ]


@pytest.mark.parametrize("name", cells("question-answering"))
async def test_qa_windows_top_k_and_the_null_answer(tmp_path: Path, name: str) -> None:
    package = published_package(name, "question-answering")
    folder = published_checkpoint(name, "question-answering")
    answerer = transformers.pipeline("question-answering", model=str(folder))
    if model_type(name) in ("xlm-roberta", "camembert"):
        same_layout_as_transformers_means(answerer.tokenizer)
    pairs = qa_pairs() + UNICODE_PAIRS + [("Who?", "Anna."), ("Where?", "In Oslo.")]
    inputs = [{"question": q, "context": c} for q, c in pairs]
    windowed = 0
    async with served(tmp_path, package) as service:
        for options in (
            {"top_k": 1, "handle_impossible_answer": False},
            {"top_k": 3, "handle_impossible_answer": True, "max_answer_len": 6},
        ):
            body = {"inputs": inputs, **options, "max_seq_len": QA_LEN, "doc_stride": QA_STRIDE}
            ours = await post(service, "/qa", {**body, "model": package.name})
            for (question, context), o in zip(pairs, ours, strict=True):
                t = answerer(question=question, context=context, **options,
                             max_seq_len=QA_LEN, doc_stride=QA_STRIDE)  # fmt: skip
                t = [a for a in (t if isinstance(t, list) else [t]) if a["score"] != 0.0]
                o = o if isinstance(o, list) else [o]  # (the pipeline's 0-score filler spans:
                # tests/service/test_family_parity_http.py)
                assert [(a["start"], a["end"], a["answer"]) for a in o] == [
                    (a["start"], a["end"], a["answer"]) for a in t
                ], (options, question)
                assert [a["score"] for a in o] == pytest.approx([a["score"] for a in t], abs=1e-4)
    for q, c in pairs:
        encoded = answerer.tokenizer(q, c, truncation="only_second", max_length=QA_LEN,
                                     stride=QA_STRIDE, return_overflowing_tokens=True)  # fmt: skip
        windowed += len(encoded["input_ids"]) > 1
    assert windowed >= 10  # contexts longer than one window


def embed_texts() -> list[str]:
    """Mixed lengths in one batch (padding matters), one past 128 tokens (ModernBERT's local
    attention window), all inside every checkpoint's window."""
    prose = (EXAMPLES / "corpus" / "stories.txt").read_text(encoding="utf-8")
    return sentences()[:10] + SPACED + UNICODE_TEXTS + [" ".join(prose.split()[:110])]


@pytest.mark.parametrize("name", cells("embedding"))
async def test_embed(tmp_path: Path, name: str) -> None:
    """The mean of the real tokens' last states, L2-normalised (the package's default, and
    all-mpnet-base-v2's 1_Pooling), against transformers' AutoModel of the same folder, and for
    the sentence-transformers folder, against SentenceTransformer.encode."""
    package = published_package(name, "embedding")
    folder = published_checkpoint(name, "embedding")
    texts = embed_texts()
    async with served(tmp_path, package) as service:
        ours = torch.tensor(await post(service, "/embed", {"inputs": texts, "model": package.name}))
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModel.from_pretrained(folder).eval()
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    assert 128 < batch["input_ids"].shape[1] <= 384, batch["input_ids"].shape
    takes = inspect.signature(model.forward).parameters
    batch = {k: v for k, v in batch.items() if k in takes}
    with torch.inference_mode():
        states = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    theirs = torch.nn.functional.normalize((states * mask).sum(1) / mask.sum(1), dim=-1)
    cosine = (ours * theirs).sum(-1)
    assert cosine.min().item() >= MIN_COSINE, (name, cosine.min().item())
    if (folder / "modules.json").is_file():
        sentence_transformers = pytest.importorskip("sentence_transformers")
        st = sentence_transformers.SentenceTransformer(str(folder), device="cpu")
        encoded = torch.from_numpy(st.encode(texts, batch_size=8))
        cosine = (ours * encoded).sum(-1) / encoded.norm(dim=-1)
        assert cosine.min().item() >= MIN_COSINE, (name, cosine.min().item())


def same_fillers(ours: list[dict], theirs: list[dict], text: str) -> None:
    assert [(f["token"], f["token_str"], f["sequence"]) for f in ours] == [
        (f["token"], f["token_str"], f["sequence"]) for f in theirs
    ], text
    assert [f["score"] for f in ours] == pytest.approx([f["score"] for f in theirs], abs=1e-4)


@pytest.mark.parametrize("name", cells("fill-mask"))
async def test_fill_mask(tmp_path: Path, name: str) -> None:
    """The checkpoint's own mask token (as transformers' tokenizer of the folder names it),
    after a space, at the start, twice, and glued to a word."""
    package = published_package(name, "fill-mask")
    folder = published_checkpoint(name, "fill-mask")
    pipe = transformers.pipeline("fill-mask", model=str(folder))
    m = pipe.tokenizer.mask_token
    texts = [f"Paris is the {m} of France.", f"A {m} sat on the {m}.", f"{m} 🙂 café",
             f"The film was{m}!", f"a lovely , funny {m}"]  # fmt: skip
    async with served(tmp_path, package) as service:
        body = {"inputs": texts, "model": package.name, "top_k": 5}
        ours = await post(service, "/fill-mask", body)
    for text, answer in zip(texts, ours, strict=True):
        theirs = pipe(text, top_k=5)
        if text.count(m) == 1:
            same_fillers(answer, theirs, text)
        else:  # one list per mask
            assert len(answer) == len(theirs) == text.count(m), text
            for a, b in zip(answer, theirs, strict=True):
                same_fillers(a, b, text)
