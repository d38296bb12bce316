"""Fine-tuning starts from any family's checkpoint: a RoBERTa (byte-level BPE), a DistilBERT
(no token types) and an XLM-R (Unigram) encoder saved with `save_pretrained` train each head
for a few steps with `python -m training.finetune --init ... --export`; the saved `best/` opens
in transformers' matching class with no missing or unexpected keys and equal outputs, and the
exported package answers through the service."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from service.settings import Settings
from tests.conftest import REPO
from tests.families import family_checkpoint
from tests.service.conftest import serve
from training.checkpoint import load_model
from training.finetune import main
from training.tokenizer import load_tokenizer

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

# slow: ~40 s, a fine-tuning run per family and head; tests/training/test_finetune.py keeps
# BERT's in the unit suite, CI's slow stage runs these
pytestmark = pytest.mark.slow

DATA = REPO / "examples" / "data"
PAIRS = [
    ("A man is playing a guitar.", "Someone plays the guitar."),
    ("The cat sleeps on the sofa.", "A cat is asleep on a couch."),
    ("Prices rose sharply in May.", "In May, prices went up a lot."),
    ("The team won the final.", "The final was won by the team."),
]
HEADS = {  # task -> (data options, transformers class, request to the served package)
    "classification": (
        ["--labels", "negative,positive", "--train", DATA / "sentiment/train.tsv",
         "--eval", DATA / "sentiment/dev.tsv"],
        "AutoModelForSequenceClassification",
        ("/classify", {"inputs": ["a wonderful film", ["it was", "dull"]]}),
    ),
    "token-classification": (
        ["--train", DATA / "ner/train.conll", "--eval", DATA / "ner/dev.conll"],
        "AutoModelForTokenClassification",
        ("/ner", {"inputs": "Anna Smith flew from Lisbon to Zürich 🙂 on Monday."}),
    ),
    "question-answering": (
        ["--train", DATA / "qa/train.json", "--eval", DATA / "qa/dev.json"],
        "AutoModelForQuestionAnswering",
        ("/qa", {"question": "Where did Anna fly?", "context": "Anna flew to Lisbon in May."}),
    ),
    "embedding": (None, "AutoModel", ("/embed", {"inputs": ["a text", "another text"]})),
}  # fmt: skip
CASES = [
    (family, task)
    for family in ("roberta", "distilbert", "deberta-v2", "modernbert", "mpnet")
    for task in HEADS
] + [
    ("xlm-roberta", "token-classification"),
    ("xlm-roberta", "question-answering"),
]
# Base models that take add_pooling_layer (and have a pooler an embedding model leaves out).
POOLED = ("bert", "roberta", "xlm-roberta", "camembert", "albert", "mpnet")


def write_pairs(folder: Path) -> list[str]:
    path = folder / "pairs.jsonl"
    path.write_text("".join(json.dumps({"anchor": a, "positive": p}) + "\n" for a, p in PAIRS))
    return ["--train", str(path)]


def outputs(model: object, batch: dict) -> list[np.ndarray]:
    with torch.inference_mode():
        out = model(**batch)
    names = ("logits", "start_logits", "end_logits", "last_hidden_state")
    return [getattr(out, n).float().numpy() for n in names if getattr(out, n, None) is not None]


@pytest.mark.anyio
@pytest.mark.parametrize(("family", "task"), CASES)
async def test_finetune_from_a_family_checkpoint(tmp_path, family, task):
    init = tmp_path / "init"  # the plain encoder a user would start from
    shutil.copytree(family_checkpoint(family, "embedding"), init)
    data, auto_class, (path, body) = HEADS[task]
    out = tmp_path / "run"
    argv = ["--task", task, "--init", str(init), "--out", str(out), "--max-steps", "2",
            "--batch-size", "4", "--export", *map(str, data or write_pairs(tmp_path))]  # fmt: skip
    assert main(argv) == 0
    best = out / "best" if (out / "best").is_dir() else out / "last"

    # An embedding model has no pooler (sentence-transformers loads it so: model_args in
    # sentence_bert_config.json); DistilBERT, DeBERTa and ModernBERT have none to leave out
    # and refuse the argument.
    no_pooler = {"add_pooling_layer": False} if task == "embedding" and family in POOLED else {}
    theirs, info = getattr(transformers, auto_class).from_pretrained(
        best, output_loading_info=True, attn_implementation="eager", **no_pooler
    )
    assert theirs.config.model_type == family
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    tok = load_tokenizer(best)
    texts = ["Anna flew to Lisbon.", "A much longer second sentence, with commas and 🙂."]
    encodings = [tok.encode(t) for t in texts]
    width = max(len(e.ids) for e in encodings)
    pad = json.loads((best / "config.json").read_text())["pad_token_id"]
    ids = torch.tensor([e.ids + [pad] * (width - len(e.ids)) for e in encodings])
    mask = torch.tensor([[1] * len(e.ids) + [0] * (width - len(e.ids)) for e in encodings])
    batch = {"input_ids": ids, "attention_mask": mask}
    ours = load_model(best, task).eval()
    with torch.inference_mode():
        mine = ours(ids, mask, torch.zeros_like(ids))
        # ours pools the embedding; compare the encoder's token states
        states = ours.bert(ids, mask, torch.zeros_like(ids)).last_hidden_state
    if task == "embedding":
        mine_list = [states.numpy()]
    else:
        names = ("logits", "start_logits", "end_logits")
        mine_list = [getattr(mine, n).numpy() for n in names if getattr(mine, n, None) is not None]
    for a, b in zip(mine_list, outputs(theirs.eval(), batch), strict=True):
        real = mask.bool().numpy()
        a, b = (a[real], b[real]) if a.ndim >= 2 and a.shape[1] == width else (a, b)
        assert np.abs(a - b).max() <= 1e-5, (family, task)

    models = tmp_path / "models"
    shutil.copytree(out / "package", models / "tuned")
    async with serve(Settings(model_dir=models, intra_op_threads=1)) as served:
        response = await served.client.post(path, json=body)
    assert response.status_code == 200, response.text
    assert response.json()
