"""ColBERT packages served (issue 51), over HTTP in process, against the libraries that publish
the layouts (tests/colbert.py): a PyLate folder and a colbert-ai HF_ColBERT, tiny and random,
exported by training.export and served beside a cross-encoder and a dense embedding model.

- /embed_all with `is_query` answers each library's `encode` (queries: every vector, the [MASK]
  expansion's included; documents: their tokens less the skiplist), unit vectors within 1e-5;
- /rerank, /v1/rerank and /v2/rerank score by MaxSim: `raw_scores` is the library's score
  (PyLate's colbert_scores, colbert-ai's colbert_score) within 1e-5, the default that divided
  by the query's vector count; a document over document_length is scored by windows of it,
  its best window counting, or cut as the libraries cut it with `truncate`;
- max_tokens_per_doc and max_tokens_per_query read the first tokens;
- which model answers a request that names none, and what a ColBERT model refuses.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from service.settings import Settings
from tests.colbert import (
    DOCUMENT_LENGTH,
    DOCUMENTS,
    QUERIES,
    QUERY_LENGTH,
    PyLate,
    bert_encoder,
    colbert_ai_folder,
    colbert_ai_modules,
    pylate_folder,
    wordpiece_with_markers,
)
from tests.families import family_checkpoint
from tests.service.conftest import Service, serve

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.filterwarnings("ignore:`torch.cuda.amp"),
    pytest.mark.filterwarnings("ignore:torch.cuda.amp.GradScaler is enabled"),
    pytest.mark.filterwarnings("ignore:CUDA is not available"),
]
torch = pytest.importorskip("torch")
TOL = 1e-5
LONG = "The score was written by a composer from São Paulo in 1962 and it is long. " * 6


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("colbert")
    encoder = bert_encoder(root / "bert", wordpiece_with_markers())
    with pytest.MonkeyPatch.context() as patch:
        colbert = colbert_ai_modules(patch)
        ai = colbert_ai_folder(colbert, root / "colbert-ai", encoder)
    return {"pylate": pylate_folder(root / "pylate", encoder), "colbert-ai": ai}


@pytest.fixture(scope="module")
async def served(
    folders: dict[str, Path], tmp_path_factory: pytest.TempPathFactory, make_package: Callable
) -> AsyncIterator[Service]:
    from training.export import export_package

    models = tmp_path_factory.mktemp("li") / "models"
    models.mkdir()
    for name, folder in folders.items():
        export_package(folder, "late-interaction", models / name, verbose=False)
    cross = family_checkpoint("bert", "classification", labels=["score"])
    export_package(cross, "classification", models / "ce", verbose=False, reads="pairs")
    make_package(models, "embedding")  # "minilm"
    async with serve(Settings(model_dir=models)) as s:
        yield s


class ColbertAi:
    """colbert-ai's own Checkpoint on its folder: encode as its tokenizers and models do, and
    score with its colbert_score."""

    def __init__(self, folder: Path) -> None:
        with pytest.MonkeyPatch.context() as patch:
            self.colbert = colbert_ai_modules(patch)
            config = self.colbert.infra.ColBERTConfig(checkpoint=str(folder))
            self.checkpoint = self.colbert.modeling.checkpoint.Checkpoint(
                str(folder), colbert_config=config, verbose=0
            )

    def encode(self, texts: list[str], is_query: bool) -> list[np.ndarray]:
        with torch.inference_mode():
            if is_query:
                return list(self.checkpoint.queryFromText(texts).numpy())
            return [d.numpy() for d in self.checkpoint.docFromText(texts, keep_dims=False)]

    def scores(self, query: str, documents: list[str]) -> np.ndarray:
        from colbert.modeling.colbert import colbert_score

        with torch.inference_mode():
            q = self.checkpoint.queryFromText([query])
            ids, mask = self.checkpoint.doc_tokenizer.tensorize(documents)
            d, d_mask = self.checkpoint.doc(ids, mask, keep_dims="return_mask")
            return colbert_score(q, d, d_mask).numpy()


def library(name: str, folder: Path) -> Callable[[list[str], bool], list[np.ndarray]]:
    if name == "pylate":
        reference = PyLate(folder)
        return lambda texts, is_query: reference.encode(texts, is_query)[1]
    return ColbertAi(folder).encode


def vectors_of(reference: PyLate, ids: list[int], is_query: bool) -> np.ndarray:
    """PyLate's encode of the text whose tokens are `ids` (already within the length): the row
    its tokenize builds (marker after [CLS]; a query expanded with [MASK], unattended), its
    model's projection, the kept positions normalised."""
    tok = reference.tok
    marker = reference.query_prefix_id if is_query else reference.document_prefix_id
    row = [tok.cls_token_id, marker, *ids, tok.sep_token_id]
    attended = len(row)
    if is_query:
        row += [tok.mask_token_id] * (QUERY_LENGTH - len(row))
    mask = [1] * attended + [0] * (len(row) - attended)
    with torch.inference_mode():
        hidden = reference.model(input_ids=torch.tensor([row]),
                                 attention_mask=torch.tensor([mask])).last_hidden_state[0]  # fmt: skip
        projected = (hidden @ reference.weight.T).numpy()
    keep = np.ones(len(row), bool) if is_query else ~np.isin(row, reference.skiplist)
    x = projected[keep].astype(np.float64)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def maxsim(q: np.ndarray, d: np.ndarray) -> float:
    """PyLate's colbert_scores on one unpadded pair: each query vector's best, summed."""
    return float((q.astype(np.float64) @ d.astype(np.float64).T).max(axis=1).sum())


async def post(served: Service, path: str, body: dict, status: int = 200) -> Any:
    response = await served.client.post(path, json=body)
    assert response.status_code == status, response.text
    return response.json()


@pytest.mark.parametrize("name", ["pylate", "colbert-ai"])
@pytest.mark.parametrize("is_query", [True, False], ids=["queries", "documents"])
async def test_embed_all_answers_the_librarys_encode(
    served: Service, folders: dict[str, Path], name: str, is_query: bool
):
    texts = QUERIES if is_query else DOCUMENTS
    got = await post(served, "/embed_all", {"inputs": texts, "is_query": is_query, "model": name})
    want = library(name, folders[name])(texts, is_query)
    for g, w in zip(got, want, strict=True):
        g = np.asarray(g, dtype=np.float32)
        assert g.shape == w.shape  # queries: QUERY_LENGTH each; documents: the kept tokens
        assert np.abs(g - w).max() <= TOL
    if is_query:
        assert all(len(g) == QUERY_LENGTH for g in got)


async def test_tokens_name_the_markers_and_the_expansion(served: Service):
    [item] = await post(served, "/embed_all", {"inputs": "Zürich", "is_query": True,
                                               "return_tokens": True, "model": "colbert-ai"})  # fmt: skip
    tokens = item["tokens"]
    assert len(tokens) == len(item["embeddings"]) == QUERY_LENGTH
    assert [t["text"] for t in tokens[:2]] == ["[CLS]", "[unused0]"]  # colbert-ai's [Q] marker
    assert all(t["special"] for t in tokens[:2]) and tokens[-1]["text"] == "[MASK]"
    body = [t for t in tokens if not t["special"]]
    assert "".join(t["text"] for t in body) == "Zürich" and body[0]["start"] == 0


@pytest.mark.parametrize("name", ["pylate", "colbert-ai"])
async def test_rerank_scores_by_the_librarys_maxsim(
    served: Service, folders: dict[str, Path], name: str
):
    query, documents = QUERIES[2], DOCUMENTS
    if name == "pylate":
        encode = library(name, folders[name])
        [q] = encode([query], True)
        want = np.array([maxsim(q, d) for d in encode(documents, False)])
    else:
        want = ColbertAi(folders[name]).scores(query, documents)
    body = {"query": query, "texts": documents, "model": name}
    # truncate: a document over document_length cut, as the libraries cut it (default: windows)
    cut = await post(served, "/rerank", body | {"raw_scores": True, "truncate": True})
    got = np.array([r["score"] for r in sorted(cut, key=lambda r: r["index"])])
    assert np.abs(got - want).max() <= TOL
    assert [r["index"] for r in cut] == list(np.argsort(-want, kind="stable"))
    raw = await post(served, "/rerank", body | {"raw_scores": True})
    mean = await post(served, "/rerank", body)
    assert [r["score"] for r in mean] == pytest.approx([r["score"] / QUERY_LENGTH for r in raw])
    cohere = await post(served, "/v2/rerank",
                        {"query": query, "documents": documents, "top_n": 2, "model": name})  # fmt: skip
    assert [r["index"] for r in cohere["results"]] == [r["index"] for r in mean[:2]]
    jina = await post(served, "/v1/rerank", {"query": query, "documents": documents, "model": name})
    assert [r["relevance_score"] for r in jina["results"]] == [r["score"] for r in mean]
    assert jina["usage"]["total_tokens"] > 0


async def test_a_long_document_is_cut_as_the_libraries_cut_it_with_truncate(
    served: Service, folders: dict[str, Path]
):
    encode = library("pylate", folders["pylate"])
    [q] = encode([QUERIES[0]], True)
    [d] = encode([LONG], False)  # cut to document_length
    [cut] = await post(served, "/rerank", {"query": QUERIES[0], "texts": [LONG], "truncate": True,
                                           "raw_scores": True, "model": "pylate"})  # fmt: skip
    assert abs(cut["score"] - maxsim(q, d)) <= TOL and "window" not in cut


async def test_a_long_document_scores_as_its_best_window(served: Service, folders: dict[str, Path]):
    """Windows of document_length (less [CLS], the marker and [SEP]), each encoded as a document
    of its own; the best window's MaxSim is the document's, and the answer names its characters."""
    reference = PyLate(folders["pylate"])
    tok = reference.tok
    [q] = reference.encode([QUERIES[0]], True)[1]
    for text, is_query in ((QUERIES[0], True), (DOCUMENTS[1], False)):  # vectors_of is PyLate's
        ids = tok(text, add_special_tokens=False)["input_ids"]
        [want] = reference.encode([text], is_query)[1]
        assert np.abs(vectors_of(reference, ids, is_query) - want).max() <= TOL
    encoded = tok(LONG, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = encoded["input_ids"], encoded["offset_mapping"]
    room = DOCUMENT_LENGTH - 3
    step = room - room // 4
    assert len(ids) > 2 * room  # three windows at least
    best, span = -np.inf, None
    for start in range(0, len(ids), step):
        stop = min(start + room, len(ids))
        d = vectors_of(reference, ids[start:stop], False)
        if (score := maxsim(q, d)) > best:
            best, span = score, (offsets[start][0], offsets[stop - 1][1])
        if stop == len(ids):
            break
    [answer] = await post(served, "/rerank", {"query": QUERIES[0], "texts": [LONG],
                                              "raw_scores": True, "model": "pylate"})  # fmt: skip
    assert abs(answer["score"] - best) <= TOL
    assert answer["window"] == {"start": span[0], "end": span[1]}


async def test_max_tokens_read_the_first_tokens(served: Service, folders: dict[str, Path]):
    reference = PyLate(folders["pylate"])
    tok = reference.tok
    doc_ids = tok(DOCUMENTS[2], add_special_tokens=False)["input_ids"][:5]
    query_ids = tok(QUERIES[2], add_special_tokens=False)["input_ids"][:4]
    q = vectors_of(reference, query_ids, True)
    d = vectors_of(reference, doc_ids, False)
    answer = await post(served, "/v1/rerank", {
        "query": QUERIES[2], "documents": [DOCUMENTS[2]], "max_tokens_per_doc": 5,
        "max_tokens_per_query": 4, "model": "pylate"})  # fmt: skip
    assert abs(answer["results"][0]["relevance_score"] - maxsim(q, d) / QUERY_LENGTH) <= TOL


async def test_which_model_answers_and_what_a_colbert_model_refuses(served: Service):
    several = await post(served, "/rerank", {"query": "q", "texts": ["a"]}, 422)
    assert all(n in several["error"] for n in ("ce", "colbert-ai", "pylate"))
    # a ColBERT model is no sentence embedding, classifier or tokenizer-free model
    embed = await post(served, "/embed", {"inputs": "a", "model": "pylate"}, 422)
    assert "needs a embedding model" in embed["error"]
    assert await post(served, "/embed", {"inputs": "a"})  # the one dense model answers
    tokens = await post(served, "/embed_all", {"inputs": "a"}, 422)
    assert "minilm" in tokens["error"] and "pylate" in tokens["error"]
    models = (await served.client.get("/models")).json()
    tasks = {m["name"]: m["task"] for m in models["models"]}
    assert tasks["pylate"] == tasks["colbert-ai"] == "late-interaction"
    endpoints = {m["name"]: m["endpoints"] for m in models["models"]}
    assert {"/embed_all", "/rerank", "/v1/rerank"} <= set(endpoints["pylate"])
    assert "/embed_all" in endpoints["minilm"] and "/embed" not in endpoints["pylate"]


async def test_the_open_inference_protocol_answers_a_colbert_model(served: Service):
    """v2: the texts in, per text its vectors as JSON (the native /embed_all answer)."""
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["Zürich"]}],
            "parameters": {"is_query": True}}  # fmt: skip
    answer = await post(served, "/v2/models/pylate/infer", body)
    [output] = answer["outputs"]
    assert output["name"] == "token_embeddings"
    vectors = json.loads(output["data"][0])
    native = await post(served, "/embed_all", {"inputs": "Zürich", "is_query": True,
                                               "model": "pylate"})  # fmt: skip
    assert np.abs(np.asarray(vectors) - np.asarray(native[0])).max() <= 1e-6
    metadata = (await served.client.get("/v2/models/pylate")).json()
    assert metadata["parameters"]["task"] == "late-interaction"
