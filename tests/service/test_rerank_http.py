"""POST /rerank (TEI's shape) and /v1/rerank (Cohere's) over HTTP against sentence-transformers'
CrossEncoder on the same tiny folders (a one-label BERT, a one-label RoBERTa saved by
CrossEncoder itself, a two-label BERT): scores <= 1e-5, the same order; long documents scored by
their best window (MaxP); and the bad input."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from service.settings import Settings
from tests.families import family_checkpoint
from tests.service.conftest import Service, serve
from training.export import export_package

pytestmark = pytest.mark.anyio
st = pytest.importorskip("sentence_transformers")

WINDOW = 64  # tokens per row: DOCUMENTS fit beside the query, the long ones below do not
QUERY = "where did Anna fly in May?"
DOCUMENTS = [
    "Anna flew to Lisbon in May.",
    "Paris is the capital of France.",
    "",
    "Café naïve 🙂 São Paulo, and New-York's mayor (2024): 3.5%",
    "The museum opened in 1990 in a former railway station near the river.",
]
FOLDERS: dict[str, Path] = {}


def cross_encoder_folder(name: str, tmp: Path) -> Path:
    """The tiny cross-encoders: 'bert' and 'pair' (two labels) as save_pretrained left them,
    'roberta' as CrossEncoder.save writes it."""
    if name == "bert":
        return family_checkpoint("bert", "classification", labels=["score"])
    if name == "pair":
        return family_checkpoint("bert", "classification", labels=["no", "yes"])
    folder = tmp / "roberta-ce"
    if not folder.exists():
        source = family_checkpoint("roberta", "classification", labels=["score"])
        st.CrossEncoder(str(source)).save(str(folder))
    return folder


@pytest.fixture(scope="module")
async def served(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Service]:
    root = tmp_path_factory.mktemp("rerank")
    for name in ("bert", "roberta", "pair"):
        FOLDERS[name] = cross_encoder_folder(name, root)
        # save_pretrained folders say nothing of pairs; CrossEncoder.save's does ('roberta')
        reads = None if name == "roberta" else "pairs"
        export_package(FOLDERS[name], "classification", root / "models" / name,
                       max_seq_length=WINDOW, verbose=False, reads=reads)  # fmt: skip
    ner = family_checkpoint("bert", "token-classification")
    export_package(ner, "token-classification", root / "models" / "ner", verbose=False)
    async with serve(Settings(model_dir=root / "models", intra_op_threads=1)) as s:
        yield s


def reference(name: str, **kwargs: Any) -> Any:
    return st.CrossEncoder(str(FOLDERS[name]), max_length=WINDOW, **kwargs)


async def post(served: Service, path: str, body: dict[str, Any], status: int = 200) -> Any:
    response = await served.client.post(path, json=body)
    assert response.status_code == status, response.text
    return response.json()


@pytest.mark.parametrize("name", ["bert", "roberta"])
async def test_scores_and_order_equal_the_cross_encoder(served: Service, name: str):
    ranked = await post(served, "/rerank", {"query": QUERY, "texts": DOCUMENTS, "model": name})
    want = reference(name).predict([(QUERY, d) for d in DOCUMENTS])  # sigmoid, one label
    assert [r["index"] for r in ranked] == list(np.argsort(-want, kind="stable"))
    got = np.array([r["score"] for r in sorted(ranked, key=lambda r: r["index"])])
    assert np.abs(got - want).max() <= 1e-5
    assert not any("window" in r for r in ranked)  # every document fits
    raw = await post(served, "/rerank", {"query": QUERY, "texts": DOCUMENTS, "model": name,
                                         "raw_scores": True, "return_text": True})  # fmt: skip
    logits = reference(name, activation_fn=__import__("torch").nn.Identity()).predict(
        [(QUERY, d) for d in DOCUMENTS]
    )
    assert max(abs(r["score"] - logits[r["index"]]) for r in raw) <= 1e-5
    assert all(r["text"] == DOCUMENTS[r["index"]] for r in raw)


async def test_two_labels_score_the_second_labels_probability(served: Service):
    ranked = await post(served, "/rerank", {"query": QUERY, "texts": DOCUMENTS, "model": "pair"})
    import torch

    logits = torch.tensor(reference("pair").predict([(QUERY, d) for d in DOCUMENTS]))
    want = torch.softmax(logits, dim=-1)[:, 1].numpy()
    assert max(abs(r["score"] - want[r["index"]]) for r in ranked) <= 1e-5


async def test_truncate_scores_long_documents_as_the_cross_encoder_cuts_them(served: Service):
    long_docs = [" ".join([d] * 12) for d in DOCUMENTS[:2]]
    body = {"query": QUERY, "texts": long_docs, "model": "bert", "truncate": True}
    ranked = await post(served, "/rerank", body)
    want = reference("bert").predict([(QUERY, d) for d in long_docs])
    assert max(abs(r["score"] - want[r["index"]]) for r in ranked) <= 1e-5


def single_token_words(name: str) -> list[str]:
    """Words the folder's tokenizer keeps as one token, so that any run of them re-tokenizes
    to the same tokens when cut out of a longer text."""
    tok = reference(name).tokenizer
    words = " ".join(DOCUMENTS + [QUERY]).replace(".", " ").replace(",", " ").split()
    return [w for w in dict.fromkeys(words) if len(tok(w, add_special_tokens=False)["input_ids"]) == 1]  # fmt: skip


async def test_a_long_document_scores_as_its_best_window(served: Service):
    """MaxP: a document longer than the window scores as its best window scored alone, and
    the answer names that window's characters."""
    words = single_token_words("bert")
    rng = np.random.default_rng(0)
    document = " ".join(rng.choice(words, size=200))
    [ranked] = await post(served, "/rerank", {"query": QUERY, "texts": [document], "model": "bert"})
    span = ranked["window"]
    assert 0 <= span["start"] < span["end"] <= len(document)
    # every window alone, as a document of its own
    tok = reference("bert").tokenizer
    encoded = tok(document, add_special_tokens=False, return_offsets_mapping=True)
    room = WINDOW - 3 - len(tok(QUERY, add_special_tokens=False)["input_ids"])
    stride = min(128, room // 2)
    offsets = encoded["offset_mapping"]
    pieces = []
    for start in range(0, len(offsets), room - stride):
        stop = min(start + room, len(offsets))
        pieces.append(document[offsets[start][0] : offsets[stop - 1][1]])
        if stop == len(offsets):
            break
    assert len(pieces) > 2
    alone = reference("bert").predict([(QUERY, p) for p in pieces])
    assert abs(ranked["score"] - alone.max()) <= 1e-5
    assert document[span["start"] : span["end"]] == pieces[int(alone.argmax())]


async def test_pairs_of_one_request_and_of_several_share_batches(served: Service):
    """Many documents in one request: one answer each, equal to scoring them one by one."""
    many = [f"{d} {i}" for i in range(8) for d in DOCUMENTS]
    ranked = await post(served, "/rerank", {"query": QUERY, "texts": many, "model": "bert"})
    assert sorted(r["index"] for r in ranked) == list(range(len(many)))
    want = reference("bert").predict([(QUERY, d) for d in many])
    assert max(abs(r["score"] - want[r["index"]]) for r in ranked) <= 1e-5


async def test_the_open_shape(served: Service):
    docs = [DOCUMENTS[0], {"text": DOCUMENTS[1]}, DOCUMENTS[4]]
    body = {
        "query": QUERY,
        "documents": docs,
        "top_n": 2,
        "return_documents": True,
        "model": "bert",
        "rank_fields": ["text"],
    }  # fmt: skip  (an unknown field: ignored)
    answer = await post(served, "/v1/rerank", body)
    assert answer["model"] == "bert" and answer["usage"]["total_tokens"] > 0
    assert len(answer["results"]) == 2
    texts = [DOCUMENTS[0], DOCUMENTS[1], DOCUMENTS[4]]
    want = reference("bert").predict([(QUERY, t) for t in texts])
    for result, index in zip(answer["results"], np.argsort(-want)[:2], strict=True):
        assert result["index"] == index
        assert abs(result["relevance_score"] - want[index]) <= 1e-5
        assert result["document"] == {"text": texts[index]}


@pytest.mark.parametrize(
    "path, body, word",
    [
        ("/rerank", {"query": QUERY, "texts": [], "model": "bert"}, "texts"),
        ("/rerank", {"query": QUERY, "texts": ["a"], "model": "ner"}, "needs a classification"),
        ("/rerank", {"query": QUERY, "texts": ["a"], "model": "nope"}, "no model named"),
        ("/rerank", {"query": "a " * 80, "texts": ["b"], "model": "bert"}, "no room"),
        ("/rerank", {"query": QUERY, "texts": ["a"], "model": "bert", "top_n": 1}, "top_n"),
        ("/v1/rerank", {"query": QUERY, "documents": [], "model": "bert"}, "documents"),
        ("/v1/rerank", {"query": QUERY, "documents": ["a"], "top_n": 0, "model": "bert"}, "top_n"),
    ],
)
async def test_bad_input_is_a_clear_4xx(served: Service, path: str, body: dict, word: str):
    response = await served.client.post(path, json=body)
    assert 400 <= response.status_code < 500, response.text
    assert word in response.json()["error"], response.text


async def test_a_package_with_other_label_counts_is_refused(
    served: Service, tmp_path: Path
) -> None:
    from heads.package import read_package
    from heads.rows import InvalidInput
    from heads.tasks import rerank

    three = family_checkpoint("bert", "classification", labels=["a", "b", "c"])
    package = read_package(
        export_package(three, "classification", tmp_path / "p", verbose=False).path
    )
    with pytest.raises(InvalidInput, match="3 labels"):
        rerank.Job(package, ["a"], rerank.Options(query=QUERY))


@pytest.mark.parametrize("path", ["/rerank", "/v1/rerank"])
async def test_the_limit_counts_documents_not_the_query(served: Service, path: str):
    limit = Settings().max_client_batch_size
    key = "texts" if path == "/rerank" else "documents"
    body = {"query": QUERY, key: [f"document {i}" for i in range(limit)], "model": "bert"}
    full = await served.client.post(path, json=body)
    assert full.status_code == 200, full.text  # exactly the limit: the query is not a document
    body[key] = [*body[key], "one more"]
    over = await served.client.post(path, json=body)
    assert over.status_code == 413
    assert over.json()["error"].startswith(f"documents has {limit + 1} items")
