"""heads.tasks.rerank: a cross-encoder's Job run as the batcher runs it (tests/heads/tasks/
served.py) on tiny exported folders (one label, two labels), against the transformers model on
rows built here from token ids: scores (sigmoid, softmax's second label, raw logits), the order
and `top_n`, `truncate` from either end, `max_tokens_per_doc` and `max_tokens_per_query`, long documents scored by their
best window (MaxP) with its characters named, and what is refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from heads.package import ModelPackage, read_package
from heads.rows import InvalidInput
from heads.tasks import rerank
from tests.families import family_checkpoint
from tests.heads.tasks.served import run_job

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from training.export import export_package  # noqa: E402 (needs torch)

WINDOW = 32
QUERY = "where did Anna fly in May?"
DOCUMENTS = ["Anna flew to Lisbon in May.", "Paris is big.", "", "The museum opened in 1990."]
LABELS = {"one": ["score"], "two": ["no", "yes"]}
TOL = 1e-5


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ModelPackage]:
    root = tmp_path_factory.mktemp("rerank")
    made = {}
    for name, labels in LABELS.items():
        folder = family_checkpoint("bert", "classification", labels=labels)
        exported = export_package(folder, "classification", root / name, max_seq_length=WINDOW,
                                  verbose=False, reads="pairs")  # fmt: skip
        made[name] = read_package(exported.path)
    return made


class Reference:
    """The transformers model of a folder, on rows `[CLS] query [SEP] document [SEP]` made
    here from token ids."""

    def __init__(self, name: str) -> None:
        folder = family_checkpoint("bert", "classification", labels=LABELS[name])
        self.tok = transformers.AutoTokenizer.from_pretrained(folder)
        self.model = transformers.AutoModelForSequenceClassification.from_pretrained(folder)
        self.model.eval()

    def ids(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False)["input_ids"]

    def logits(self, query: list[int], documents: list[list[int]]) -> np.ndarray:
        cls, sep = self.tok.cls_token_id, self.tok.sep_token_id
        out = []
        for d in documents:
            ids = [cls, *query, sep, *d, sep]
            types = [0] * (len(query) + 2) + [1] * (len(d) + 1)
            with torch.inference_mode():
                logits = self.model(input_ids=torch.tensor([ids]), token_type_ids=torch.tensor([types])).logits  # fmt: skip
            out.append(logits[0].numpy().astype(np.float64))
        return np.stack(out)


def relevance(logits: np.ndarray, raw: bool) -> np.ndarray:
    """CrossEncoder.predict's score: one label -> sigmoid (raw: the logit); two -> softmax's
    second (raw: its logit)."""
    if logits.shape[1] == 1:
        return logits[:, 0] if raw else 1 / (1 + np.exp(-logits[:, 0]))
    if raw:
        return logits[:, 1]
    e = np.exp(logits)
    return e[:, 1] / e.sum(axis=1)


def by_index(answer: list[dict[str, Any]]) -> np.ndarray:
    return np.array([a["score"] for a in sorted(answer, key=lambda a: a["index"])])


@pytest.mark.parametrize("raw", [False, True])
@pytest.mark.parametrize("name", ["one", "two"])
def test_scores_and_order_equal_the_model(packages: dict, name: str, raw: bool):
    ref = Reference(name)
    want = relevance(ref.logits(ref.ids(QUERY), [ref.ids(d) for d in DOCUMENTS]), raw)
    answer = run_job(
        packages[name],
        rerank.Job(packages[name], DOCUMENTS, rerank.Options(query=QUERY, raw_scores=raw)),
    )
    assert [a["index"] for a in answer] == np.argsort(-want, kind="stable").tolist()
    assert np.abs(by_index(answer) - want).max() <= TOL
    assert len(set(by_index(answer).round(4))) == len(DOCUMENTS)  # the scores tell them apart
    assert all("window" not in a for a in answer)
    top = run_job(
        packages[name], rerank.Job(packages[name], DOCUMENTS, rerank.Options(query=QUERY, top_n=2))
    )
    assert [a["index"] for a in top] == np.argsort(-relevance(ref.logits(ref.ids(QUERY),
            [ref.ids(d) for d in DOCUMENTS]), False), kind="stable")[:2].tolist()  # fmt: skip


def test_equal_scores_keep_the_documents_order(packages: dict):
    answer = run_job(
        packages["one"],
        rerank.Job(packages["one"], ["a cat", "b", "a cat"], rerank.Options(query=QUERY)),
    )
    order = [a["index"] for a in answer]
    assert order.index(0) < order.index(2)  # the same text: the same score, first one first
    assert answer[order.index(0)]["score"] == answer[order.index(2)]["score"]


@pytest.mark.parametrize("direction", [None, "right", "left"])
def test_truncate_cuts_the_pair_to_the_window(packages: dict, direction: str | None):
    """truncate=True: one row per document, the longer side cut first (longest_first), from
    the end `truncation_direction` names."""
    ref = Reference("one")
    long = " ".join(["the museum opened in a station near the river"] * 6)
    docs = [long, DOCUMENTS[1]]
    chosen = {} if direction is None else {"truncation_direction": direction}
    job = rerank.Job(
        packages["one"], docs, rerank.Options(query=QUERY, truncate=True, **chosen)
    )  # default: right
    answer = run_job(packages["one"], job)
    q, d = ref.ids(QUERY), ref.ids(long)
    n = WINDOW - 3 - len(q)  # the document is the longer: only it loses tokens
    cut = d[len(d) - n :] if direction == "left" else d[:n]
    want = relevance(ref.logits(q, [cut, ref.ids(DOCUMENTS[1])]), False)
    assert np.abs(by_index(answer) - want).max() <= TOL
    assert job.truncated == 1 and job.windowed == 0
    assert job.tokens == WINDOW + len(q) + len(ref.ids(DOCUMENTS[1])) + 3


def test_max_tokens_per_doc_keeps_each_documents_first_tokens(packages: dict):
    ref = Reference("one")
    job = rerank.Job(packages["one"], DOCUMENTS, rerank.Options(query=QUERY, max_tokens_per_doc=3))
    answer = run_job(packages["one"], job)
    want = relevance(ref.logits(ref.ids(QUERY), [ref.ids(d)[:3] for d in DOCUMENTS]), False)
    assert np.abs(by_index(answer) - want).max() <= TOL
    assert job.tokens == sum(len(ref.ids(QUERY)) + 3 + min(3, len(ref.ids(d))) for d in DOCUMENTS)


def test_max_tokens_per_query_keeps_the_querys_first_tokens(packages: dict):
    """vLLM's split beside max_tokens_per_doc: the query is read up to N tokens, and the
    room it leaves goes to the document."""
    ref = Reference("two")
    options = rerank.Options(query=QUERY, max_tokens_per_query=4, max_tokens_per_doc=5)
    job = rerank.Job(packages["two"], DOCUMENTS, options)
    answer = run_job(packages["two"], job)
    q = ref.ids(QUERY)
    assert len(q) > 4  # the cut is reached
    want = relevance(ref.logits(q[:4], [ref.ids(d)[:5] for d in DOCUMENTS]), False)
    assert np.abs(by_index(answer) - want).max() <= TOL
    assert job.tokens == sum(4 + 3 + min(5, len(ref.ids(d))) for d in DOCUMENTS)


@pytest.mark.parametrize("stride", [None, 0, 5])
def test_a_long_document_scores_as_its_best_window(packages: dict, stride: int | None):
    """MaxP: windows of the room beside the query, consecutive ones sharing `stride` tokens
    (default: half the room), the last ending at the document's end; the document's score is
    its best window's, and the answer names that window's characters."""
    ref = Reference("one")
    rng = np.random.default_rng(0)
    words = ["anna", "flew", "to", "lisbon", "in", "may", "paris", "museum", "river", "big"]
    long = " ".join(rng.choice(words, size=70))
    docs = [DOCUMENTS[0], long]
    job = rerank.Job(packages["one"], docs, rerank.Options(query=QUERY, stride=stride))
    answer = run_job(packages["one"], job)
    q = ref.ids(QUERY)
    encoded = ref.tok(long, add_special_tokens=False, return_offsets_mapping=True)
    d, offsets = encoded["input_ids"], encoded["offset_mapping"]
    room = WINDOW - 3 - len(q)
    step = room - (room // 2 if stride is None else stride)
    spans = []
    for start in range(0, len(d), step):
        spans.append((start, min(start + room, len(d))))
        if spans[-1][1] == len(d):
            break
    assert len(spans) > 2
    alone = relevance(ref.logits(q, [d[a:b] for a, b in spans]), False)
    best = int(alone.argmax())
    [windowed] = [a for a in answer if a["index"] == 1]
    assert abs(windowed["score"] - alone.max()) <= TOL
    assert windowed["window"] == {"start": offsets[spans[best][0]][0], "end": offsets[spans[best][1] - 1][1]}  # fmt: skip
    short = relevance(ref.logits(q, [ref.ids(DOCUMENTS[0])]), False)[0]
    [first] = [a for a in answer if a["index"] == 0]
    assert abs(first["score"] - short) <= TOL and "window" not in first
    assert [a["index"] for a in answer] == ([0, 1] if short > alone.max() else [1, 0])
    assert job.windowed == 1
    assert job.tokens == sum(len(q) + 3 + b - a for a, b in spans) + len(q) + 3 + len(ref.ids(DOCUMENTS[0]))  # fmt: skip


def test_what_cannot_be_ranked_is_refused(packages: dict, tmp_path: Path):
    ref = Reference("one")
    long_query = "where " * 40
    with pytest.raises(InvalidInput) as no_room:
        run_job(
            packages["one"], rerank.Job(packages["one"], ["a"], rerank.Options(query=long_query))
        )
    assert str(no_room.value) == (
        f"the query is {len(ref.ids(long_query))} tokens: no room for a document in this "
        f"model's window of {WINDOW}; shorten it or send truncate: true"
    )
    room = WINDOW - 3 - len(ref.ids(QUERY))
    with pytest.raises(InvalidInput) as stride:
        run_job(
            packages["one"],
            rerank.Job(packages["one"], ["a " * 60], rerank.Options(query=QUERY, stride=room)),
        )
    assert str(stride.value) == f"stride must be below {room}, the document tokens per window"
    run_job(
        packages["one"],
        rerank.Job(packages["one"], ["a " * 60], rerank.Options(query=QUERY, stride=room - 1)),
    )
    with pytest.raises(InvalidInput) as empty:
        rerank.Job(packages["one"], [], rerank.Options(query=QUERY))
    assert str(empty.value) == "texts is empty; send at least one document"
    three = family_checkpoint("bert", "classification", labels=["a", "b", "c"])
    package = read_package(export_package(three, "classification", tmp_path / "p", verbose=False).path)  # fmt: skip
    with pytest.raises(InvalidInput) as labels:
        rerank.Job(package, ["a"], rerank.Options(query=QUERY))
    assert str(labels.value) == (
        f"model {package.name!r} has 3 labels; a reranker (cross-encoder) has one relevance "
        "score (or two labels, relevant second)"
    )


def test_jobs_answered_together_each_get_their_own_ranking(packages: dict):
    from heads.rows import load_package_tokenizer
    from tests.heads.tasks.served import run_rows

    pkg = packages["one"]
    tok = load_package_tokenizer(pkg.tokenizer_path)
    jobs = [
        rerank.Job(pkg, DOCUMENTS, rerank.Options(query=QUERY)),
        rerank.Job(pkg, DOCUMENTS[::-1], rerank.Options(query="a museum")),
    ]
    outputs = [
        run_rows(pkg, job.rows(tok, tok.encode_batch(job.texts, add_special_tokens=False)))
        for job in jobs
    ]
    together = rerank.Job.answer_many(jobs, outputs)
    assert together == [job.answer(outs) for job, outs in zip(jobs, outputs, strict=True)]
    assert together[0] != together[1]


def test_scores_stay_finite_for_large_logits():
    """The softmax of two labels is taken row by row after subtracting the row's largest
    logit: no overflow, and a row of small logits is not swamped by another row's large one."""
    logits = np.array([[1000.0, 0.0], [0.0, 1000.0], [0.0, 1.0]], dtype=np.float32)
    np.testing.assert_allclose(
        rerank.scores(logits, raw=False), [0.0, 1.0, 1 / (1 + np.exp(-1.0))], atol=1e-12
    )
    np.testing.assert_array_equal(rerank.scores(logits, raw=True), [0.0, 1000.0, 1.0])
    one = np.array([[-50.0], [2.0]], dtype=np.float32)
    np.testing.assert_allclose(rerank.scores(one, raw=False), 1 / (1 + np.exp([50.0, -2.0])))


def test_windows_are_counted_per_document_and_a_room_of_one_is_enough(packages: dict):
    ref = Reference("one")
    q = ref.ids(QUERY)
    room = WINDOW - 3 - len(q)
    two = "anna"
    while len(ref.ids(two)) <= room:  # longer than the room, short enough for two windows
        two += " may"
    assert room < len(ref.ids(two)) <= room + room // 2
    job = rerank.Job(packages["one"], [two, "a", two + " " + two], rerank.Options(query=QUERY))
    run_job(packages["one"], job)
    assert job.windowed == 2  # two of three documents, one of them in exactly two windows
    # a query that leaves one token of room: each document is read a token at a time
    query = " ".join(["may"] * (WINDOW - 4))
    assert len(ref.ids(query)) == WINDOW - 4
    [answer] = run_job(
        packages["one"],
        rerank.Job(packages["one"], ["anna flew"], rerank.Options(query=query, stride=0)),
    )
    alone = relevance(ref.logits(ref.ids(query), [[i] for i in ref.ids("anna flew")]), False)
    assert abs(answer["score"] - alone.max()) <= TOL
