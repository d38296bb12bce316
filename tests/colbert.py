"""Tiny ColBERT checkpoints in both published layouts, and each library's encoding of them, for
the late-interaction tests (issue 51): training's export tests and the service's.

- colbert-ai 0.2.22 itself: an HF_ColBERT saved as its Checkpoint saves one (`colbert_ai_folder`),
  read back with its own `Checkpoint`;
- PyLate 1.0.0's logic, reproduced from its source (pylate/models/colbert.py: `__init__`,
  `tokenize`, `encode`, `save`; `PyLate`, `pylate_folder`): PyLate 1.0.0 does not run with
  sentence-transformers 5.7 (its import of `generate_model_card` fails; patched past that,
  `encode` needs the removed `_text_length`, and `tokenize`'s padding="max_length" is dropped,
  so queries are not expanded), and later PyLates pin an older sentence-transformers. The
  reproduction was checked against PyLate 1.0.0 itself running on sentence-transformers 3.0.1
  (the version of its release): same folder files, same rows, vectors within 1e-6.

Models are random (seeded), hidden 32, 2 layers, on tests/families.py's tokenizers. Nothing is
downloaded.
"""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.families import MAX_POSITIONS, _tokenizer

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
ort = pytest.importorskip("onnxruntime")
from safetensors.torch import load_file, save_file  # noqa: E402

QUERIES = ["Who wrote the score?", "Zürich", "what is the capital of France and why is it there"]
DOCUMENTS = [
    "The score was written by a composer from São Paulo, in 1962.",
    "Hi!",
    "Paris is the capital of France; it sits on the Seine (a river) — and it is old.",
]
DIMENSION = 16
QUERY_LENGTH, DOCUMENT_LENGTH = 12, 24
TOLERANCE = 1e-5  # unit vectors; float32 ORT against float32 PyTorch stays near 1e-7


def onnx_vectors(pkg: Any, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
    """The package's token_embeddings on these rows (token types 0, as both libraries send),
    each position L2-normalised as the service does."""
    session = ort.InferenceSession(
        str(pkg.variant_path("fp32")), providers=["CPUExecutionProvider"]
    )
    feeds = {
        "input_ids": input_ids.astype(np.int64),
        "attention_mask": attention_mask.astype(np.int64),
        "token_type_ids": np.zeros_like(input_ids, dtype=np.int64),
    }
    wanted = {i.name for i in session.get_inputs()}
    (states,) = session.run(["token_embeddings"], {k: v for k, v in feeds.items() if k in wanted})
    norms = np.linalg.norm(states.astype(np.float64), axis=-1, keepdims=True)
    return states / np.maximum(norms, 1e-12)


def kept_by_package(pkg: Any, ids: np.ndarray, mask: np.ndarray, is_query: bool) -> np.ndarray:
    """(B, T) bool: the positions the package's block says answer (the service's rule)."""
    if is_query:
        return np.ones_like(ids, dtype=bool)
    skip = np.isin(ids, pkg.late_interaction["skiplist_ids"])
    return (mask == 1) & ~skip


# --- tokenizers and encoders ---------------------------------------------------------------


def wordpiece_with_markers() -> Any:
    """tests/families.py's WordPiece tokenizer with [unused0] and [unused1] in its vocabulary
    (as BERT's own has them: plain entries, not added tokens), wrapped as transformers'
    BertTokenizerFast."""
    from tokenizers import Tokenizer

    spec = json.loads(_tokenizer("wordpiece").to_str())
    vocab = spec["model"]["vocab"]
    for token in ("[unused0]", "[unused1]"):
        vocab[token] = len(vocab)
    return transformers.BertTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(spec)),
        unk_token="[UNK]", sep_token="[SEP]", pad_token="[PAD]", cls_token="[CLS]",
        mask_token="[MASK]", do_lower_case=False, model_max_length=MAX_POSITIONS,
    )  # fmt: skip


def bert_encoder(folder: Path, tokenizer: Any, seed: int = 0) -> Path:
    """A random tiny BertModel (hidden 32, 2 layers) saved with `tokenizer`."""
    config = transformers.BertConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=37, max_position_embeddings=MAX_POSITIONS, initializer_range=0.2,
    )  # fmt: skip
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        transformers.BertModel(config, add_pooling_layer=False).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


# --- PyLate 1.0.0, reproduced ----------------------------------------------------------------


def pylate_folder(
    folder: Path,
    encoder: Path,
    *,
    query_prefix: str = "[Q] ",
    document_prefix: str = "[D] ",
    attend_to_expansion_tokens: bool = False,
    seed: int = 1,
) -> Path:
    """A ColBERT folder as PyLate 1.0.0 writes it from `encoder`: `ColBERT.__init__` adds both
    prefixes to the tokenizer (new tokens unless the vocabulary has them), resizes the
    embeddings to it, makes the mask token the pad token and puts a Dense module (no bias)
    after the Transformer; `save` writes the sentence-transformers folder and its
    config_sentence_transformers.json. Dense weights: random, seeded."""
    tok = transformers.AutoTokenizer.from_pretrained(encoder)
    model = transformers.AutoModel.from_pretrained(encoder)
    tok.add_tokens([query_prefix, document_prefix])
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model.resize_token_embeddings(len(tok))  # new rows drawn as transformers draws them
        linear = torch.nn.Linear(model.config.hidden_size, DIMENSION, bias=False)
    tok.pad_token = tok.mask_token
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Dense", "type": "pylate.models.Dense"},
    ]
    (folder / "modules.json").write_text(json.dumps(modules, indent=2))
    (folder / "1_Dense").mkdir()
    dense = {"in_features": model.config.hidden_size, "out_features": DIMENSION, "bias": False,
             "activation_function": "torch.nn.modules.linear.Identity"}  # fmt: skip
    (folder / "1_Dense" / "config.json").write_text(json.dumps(dense))
    save_file({"linear.weight": linear.weight.detach().contiguous()},
              folder / "1_Dense" / "model.safetensors")  # fmt: skip
    settings = {
        "prompts": {}, "default_prompt_name": None, "similarity_fn_name": None,
        "query_prefix": query_prefix, "document_prefix": document_prefix,
        "query_length": QUERY_LENGTH, "document_length": DOCUMENT_LENGTH,
        "attend_to_expansion_tokens": attend_to_expansion_tokens,
        "skiplist_words": list(string.punctuation),
    }  # fmt: skip
    (folder / "config_sentence_transformers.json").write_text(json.dumps(settings, indent=2))
    # the Transformer module's window is whatever PyLate's last tokenize set (length - 1)
    st = {"max_seq_length": DOCUMENT_LENGTH - 1, "do_lower_case": False}
    (folder / "sentence_bert_config.json").write_text(json.dumps(st))
    return folder


class PyLate:
    """PyLate 1.0.0's `ColBERT` on a folder, reproduced: `tokenize` and `encode`
    (normalize_embeddings=True, pool_factor=1)."""

    def __init__(self, folder: Path) -> None:
        settings = json.loads((folder / "config_sentence_transformers.json").read_text())
        self.settings = settings
        self.tok = transformers.AutoTokenizer.from_pretrained(folder)
        self.model = transformers.AutoModel.from_pretrained(folder).eval()
        self.weight = load_file(folder / "1_Dense" / "model.safetensors")["linear.weight"]
        # ColBERT.__init__: ids by name (an unknown word is the unknown token's id)
        self.query_prefix_id = self.tok.convert_tokens_to_ids(settings["query_prefix"])
        self.document_prefix_id = self.tok.convert_tokens_to_ids(settings["document_prefix"])
        self.tok.pad_token_id = self.tok.mask_token_id
        self.skiplist = [self.tok.convert_tokens_to_ids(w) for w in settings["skiplist_words"]]

    def tokenize(self, texts: list[str], is_query: bool) -> dict[str, Any]:
        """ColBERT.tokenize: the Transformer's window is the length less one (the marker's
        place); queries padded to it (with the mask token: the pad token now), documents to
        the batch's longest; the marker goes in after the first token, attended."""
        length = self.settings["query_length" if is_query else "document_length"]
        features = self.tok(
            [t.strip() for t in texts],  # sentence-transformers' Transformer.tokenize strips
            padding="max_length" if is_query else True,
            truncation="longest_first",
            max_length=length - 1,
            return_tensors="pt",
        )
        prefix = self.query_prefix_id if is_query else self.document_prefix_id
        for key, value in (("input_ids", prefix), ("attention_mask", 1), ("token_type_ids", 0)):
            if key not in features:  # ModernBERT's tokenizer gives no token types
                continue
            t = features[key]
            features[key] = torch.cat([t[:, :1], torch.full_like(t[:, :1], value), t[:, 1:]], 1)
        if is_query and self.settings["attend_to_expansion_tokens"]:
            features["attention_mask"].fill_(1)
        return features

    def encode(self, texts: list[str], is_query: bool) -> tuple[dict[str, Any], list[np.ndarray]]:
        """ColBERT.encode: every query vector, a document's real tokens less the skiplist's,
        each L2-normalised. Returns the rows too."""
        features = self.tokenize(texts, is_query)
        with torch.inference_mode():
            hidden = self.model(**features).last_hidden_state
            projected = hidden @ self.weight.T
        ids, mask = features["input_ids"], features["attention_mask"]
        keep = (
            torch.ones_like(ids, dtype=torch.bool)
            if is_query
            else ~torch.isin(ids, torch.tensor(self.skiplist)) & mask.bool()
        )
        vectors = [
            torch.nn.functional.normalize(p[k], p=2, dim=1).numpy()
            for p, k in zip(projected, keep, strict=True)
        ]
        return features, vectors


# --- colbert-ai 0.2.22 itself --------------------------------------------------------------


def colbert_ai_modules(monkeypatch: Any) -> Any:
    """colbert-ai's modules, its C++ MaxSim extension left unbuilt (it compiles one on the first
    CPU ColBERT; only colbert_score_packed's search path uses it, not the encoders), and the
    metadata its configs record without git: it asks GitPython for the checkout's branch,
    which raises on a detached HEAD (CI's checkout of a commit)."""
    pytest.importorskip("colbert")
    from colbert.infra.config import base_config, core_config
    from colbert.modeling.colbert import ColBERT
    from colbert.utils.utils import dotdict

    monkeypatch.setattr(ColBERT, "loaded_extensions", True, raising=False)
    for module in (base_config, core_config):
        monkeypatch.setattr(module, "get_metadata_only", lambda: dotdict(), raising=False)
    import colbert.infra
    import colbert.modeling.checkpoint
    import colbert.modeling.hf_colbert

    return colbert


def colbert_ai_folder(colbert: Any, folder: Path, encoder: Path, **settings: Any) -> Path:
    """An HF_ColBERT of `encoder` saved as colbert-ai's Checkpoint.save does: save_pretrained
    (model and tokenizer) and artifact.metadata. Its `linear` is drawn by HF_ColBERT's own
    init (seeded)."""
    config = colbert.infra.ColBERTConfig(
        dim=DIMENSION, query_maxlen=QUERY_LENGTH, doc_maxlen=DOCUMENT_LENGTH, **settings
    )
    hf_colbert = colbert.modeling.hf_colbert.class_factory(str(encoder))
    with torch.random.fork_rng():
        torch.manual_seed(2)
        model = hf_colbert.from_pretrained(str(encoder), colbert_config=config)
    model.save_pretrained(folder)
    transformers.AutoTokenizer.from_pretrained(encoder).save_pretrained(folder)
    config.save_for_checkpoint(str(folder))
    return folder
