"""The served answers are transformers pipelines' answers, end to end over HTTP.

tests/heads/tasks compare the pipelines with our pre/post steps fed by a torch forward pass;
here the whole chain is under test: a tiny random transformers model and its tokenizer are
saved as a checkpoint folder, training.export turns that folder into a package, the real app
serves the package (ONNX Runtime, batching with padding, JSON), and the pipeline loads the
same folder. Real texts: SST-2, CoNLL-2003 and SQuAD dev (../shared/data; skipped without it).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from service.settings import Settings
from tests.heads.tasks.conftest import (  # noqa: F401 (fixtures, used by name)
    NER_LABELS,
    _one_torch_thread,
    conll_sentences,
    hf_cased,
    hf_uncased,
    squad_pairs,
    sst2_sentences,
    tiny_model,
    uncased_vocab,
)
from tests.heads.tasks.test_ner import STRATEGIES, UNICODE_TEXTS
from tests.heads.tasks.test_qa import UNICODE_PAIRS
from tests.service.conftest import Service, serve

pytestmark = [pytest.mark.shared, pytest.mark.anyio]

# package name -> problem type, tiny_model config (as in tasks/test_classify.py)
CLASSIFIERS = {
    "sst2": ("single_label", {"num_labels": 2}),
    "topics": ("single_label", {"num_labels": 3}),
    "toxic": ("multi_label", {"num_labels": 3, "problem_type": "multi_label_classification"}),
    "stsb": ("regression", {"num_labels": 1, "problem_type": "regression"}),
}
CLASSIFY_LEN = 24  # short enough that most pairs and some sentences are truncated
NER_LEN = 128  # every CoNLL sentence fits one window: windowed merging differs by design
QA_LEN, QA_STRIDE = 64, 16  # small windows: most SQuAD contexts span several
QA_WINDOWS = {"max_seq_len": QA_LEN, "doc_stride": QA_STRIDE}


@pytest.fixture(scope="module")
def root(
    tmp_path_factory: pytest.TempPathFactory,
    tiny_model: Callable[..., Any],  # noqa: F811
    hf_uncased: Any,  # noqa: F811
    hf_cased: Any,  # noqa: F811
) -> Path:
    """root/checkpoints/NAME: a transformers checkpoint folder (model and tokenizer);
    root/models/NAME: the package training.export makes of it, tokenizer included."""
    from training import export

    root = tmp_path_factory.mktemp("parity")
    specs: dict[str, tuple[str, str, Any, int, dict, int]] = {
        name: (
            "classification",
            "BertForSequenceClassification",
            hf_uncased,
            len(problem_type),
            config,
            CLASSIFY_LEN,
        )
        for name, (problem_type, config) in CLASSIFIERS.items()
    }
    specs["conll"] = (
        "token-classification",
        "BertForTokenClassification",
        hf_cased,
        1,
        {
            "id2label": dict(enumerate(NER_LABELS)),
            "label2id": {t: i for i, t in enumerate(NER_LABELS)},
        },
        NER_LEN,
    )
    specs["squad"] = ("question-answering", "BertForQuestionAnswering", hf_uncased, 2, {}, QA_LEN)
    for name, (task, cls, hf, seed, config, max_len) in specs.items():
        checkpoint = root / "checkpoints" / name
        tiny_model(cls, hf.vocab_size, seed=seed, **config).save_pretrained(checkpoint)
        hf.save_pretrained(checkpoint)
        export.export_package(
            checkpoint, task, root / "models" / name, max_seq_length=max_len, verbose=False
        )
    return root


@pytest.fixture(scope="module")
async def served(root: Path) -> AsyncIterator[Service]:
    async with serve(Settings(model_dir=root / "models", intra_op_threads=1)) as s:
        yield s


def pipe(root: Path, task: str, name: str, **kwargs: Any) -> Any:
    from transformers import pipeline

    return pipeline(task, model=str(root / "checkpoints" / name), **kwargs)


async def post(served: Service, path: str, body: dict) -> Any:
    response = await served.client.post(path, json=body)
    assert response.status_code == 200, response.text
    return response.json()


def spans(entities: list[dict], key: str) -> list[tuple[str, int, int]]:
    return [(e[key], e["start"], e["end"]) for e in entities]


@pytest.mark.parametrize("name", list(CLASSIFIERS))
async def test_classify_as_the_pipeline(
    served: Service, root: Path, shared_data: Path, name: str
) -> None:
    problem_type, config = CLASSIFIERS[name]
    num_labels = config["num_labels"]
    classifier = pipe(root, "text-classification", name)
    sentences = sst2_sentences(shared_data, 60) + ["", "   ", "Café\u0301 😀 東京 \x07 naïve"]
    pairs = list(zip(sentences[:25], sentences[25:50], strict=True))
    n_truncated = 0
    for inputs, hf_inputs in [
        (sentences, sentences),
        ([list(p) for p in pairs], [{"text": a, "text_pair": b} for a, b in pairs]),
    ]:
        encodings = [
            classifier.tokenizer(**x) if isinstance(x, dict) else classifier.tokenizer(x)
            for x in hf_inputs
        ]
        n_truncated += sum(len(e["input_ids"]) > CLASSIFY_LEN for e in encodings)
        for top_k in (None, 1):
            ours = await post(
                served, "/classify", {"inputs": inputs, "top_k": top_k, "model": name}
            )
            theirs = classifier(hf_inputs, top_k=top_k, truncation=True, max_length=CLASSIFY_LEN)
            assert len(ours) == len(theirs) == len(inputs)
            for text, o, t in zip(inputs, ours, theirs, strict=True):
                assert len(o) == (num_labels if top_k is None else 1)
                assert [x["label"] for x in o] == [x["label"] for x in t], (problem_type, text)
                assert [x["score"] for x in o] == pytest.approx(
                    [x["score"] for x in t], abs=1e-4
                ), text
    assert n_truncated > 20  # the served window is the pipeline's max_length


@pytest.mark.parametrize("strategy", STRATEGIES)
async def test_ner_as_the_pipeline(
    served: Service, root: Path, shared_data: Path, strategy: str
) -> None:
    recognizer = pipe(root, "token-classification", "conll", aggregation_strategy=strategy)
    texts = conll_sentences(shared_data, 60) + UNICODE_TEXTS
    assert max(len(recognizer.tokenizer(t)["input_ids"]) for t in texts) <= NER_LEN
    ours = await post(
        served, "/ner", {"inputs": texts, "aggregation_strategy": strategy, "model": "conll"}
    )
    key = "entity" if strategy == "none" else "entity_group"
    found = 0
    for text, o in zip(texts, ours, strict=True):
        t = recognizer(text)
        # offsets, not the pipeline's decoded word: ours is text[start:end] by design
        assert spans(o, key) == spans(t, key), text
        assert [e["score"] for e in o] == pytest.approx([float(e["score"]) for e in t], abs=1e-4), (
            text
        )
        assert all(e["word"] == text[e["start"] : e["end"]] for e in o)
        if strategy == "none":
            assert [e["index"] for e in o] == [e["index"] for e in t]
        found += len(o)
    assert found > 500  # the random model does name things: the comparison is not vacuous


@pytest.mark.parametrize(
    ("top_k", "max_answer_len", "handle_impossible_answer"),
    [(1, 15, False), (3, 15, True), (5, 4, False)],
)
async def test_qa_as_the_pipeline(
    served: Service,
    root: Path,
    shared_data: Path,
    top_k: int,
    max_answer_len: int,
    handle_impossible_answer: bool,
) -> None:
    answerer = pipe(root, "question-answering", "squad")
    pairs = squad_pairs(shared_data, 50) + UNICODE_PAIRS
    options = {
        "top_k": top_k,
        "max_answer_len": max_answer_len,
        "handle_impossible_answer": handle_impossible_answer,
    }
    inputs = [{"question": q, "context": c} for q, c in pairs]
    ours = await post(served, "/qa", {"inputs": inputs, **options, **QA_WINDOWS, "model": "squad"})
    n_windowed = 0
    for (question, context), o in zip(pairs, ours, strict=True):
        windows = answerer.tokenizer(
            question,
            context,
            truncation="only_second",
            max_length=QA_LEN,
            stride=QA_STRIDE,
            return_overflowing_tokens=True,
        )["input_ids"]
        n_windowed += len(windows) > 1
        t = answerer(question=question, context=context, **options, **QA_WINDOWS)
        t = t if isinstance(t, list) else [t]
        o = o if top_k > 1 else [o]
        assert [(a["start"], a["end"], a["answer"]) for a in o] == [
            (a["start"], a["end"], a["answer"]) for a in t
        ], question
        assert [a["score"] for a in o] == pytest.approx([a["score"] for a in t], abs=1e-4)
        assert all(a["answer"] == context[a["start"] : a["end"]] for a in o)
    assert n_windowed >= 40  # contexts longer than the window, as served
