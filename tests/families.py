"""Tiny Hugging Face checkpoints of every BERT-family model type, saved with `save_pretrained`
exactly as a user's fine-tuned head would be, for the tests of issue 17 (bring your own model).

    >>> folder = family_checkpoint("roberta", "question-answering")
    >>> folder = family_checkpoint("distilbert", "classification", labels=["neg", "pos"])
    >>> folder = family_checkpoint("roberta", "classification", slow_tokenizer=True)
    >>> folder = family_checkpoint("bert", "masked-lm")  # BertForMaskedLM (not for ELECTRA)

Each model is random (seeded) with transformers' own config and model classes, hidden 32, 2
layers; its tokenizer is trained here with the `tokenizers` library on text the repository ships
(examples/data and the demo heads' generated sentences, so a fresh clone builds them without
../shared), in the family's own kind and template:

    bert, electra, distilbert   WordPiece, cased, `[CLS] a [SEP] b [SEP]`, [PAD] = 0
    roberta                     byte-level BPE, `<s> a </s></s> b </s>`, <pad> = 1
    xlm-roberta, camembert      Unigram (SentencePiece's Metaspace), `<s> a </s></s> b </s>`, <pad> = 1
    albert                      Unigram, lowercased, `[CLS] a [SEP] b [SEP]`, <pad> = 0
    deberta-v2                  Unigram (DeBERTa-v3's SentencePiece), `[CLS] a [SEP] b [SEP]`, [PAD] = 0
    modernbert                  byte-level BPE, `[CLS] a [SEP] b [SEP]`, [PAD] last of the specials
    mpnet                       WordPiece, lowercased, `<s> a </s></s> b </s>`, <pad> = 1

The new families are configured to reach what sets them apart in rows of 64 and 128 tokens:
DeBERTa-v3's log-bucketed relative positions (16 buckets, 64 positions), ModernBERT's local
layer (a window of 16; layers 0 and 2 global, 1 local), MPNet's relative position bias.

`slow_tokenizer=True` saves the folder the old way, without tokenizer.json (RoBERTa:
vocab.json + merges.txt; WordPiece families: vocab.txt). Nothing is downloaded. Folders are
cached per argument set for the session; treat them as read-only.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from tests.conftest import EXAMPLES

FAMILIES = ("bert", "roberta", "xlm-roberta", "camembert", "distilbert", "electra", "albert",
            "deberta-v2", "modernbert", "mpnet")  # fmt: skip
TASK_CLASSES = {  # our task -> transformers class-name suffix
    "classification": "ForSequenceClassification",
    "token-classification": "ForTokenClassification",
    "question-answering": "ForQuestionAnswering",
    "embedding": "Model",
    "masked-lm": "ForMaskedLM",  # what fill-mask and SPLADE packages export
}
CLASS_PREFIX = {
    "bert": "Bert",
    "roberta": "Roberta",
    "xlm-roberta": "XLMRoberta",
    "camembert": "Camembert",
    "distilbert": "DistilBert",
    "electra": "Electra",
    "albert": "Albert",
    "deberta-v2": "DebertaV2",
    "modernbert": "ModernBert",
    "mpnet": "MPNet",
}
NER_LABELS = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]
VOCAB_SIZE = 1200
MAX_POSITIONS = 128  # tokens per row; the RoBERTa family's table has 2 rows more

_cache_root = Path(tempfile.mkdtemp(prefix="bert-heads-families-"))
atexit.register(shutil.rmtree, _cache_root, True)


def training_lines() -> list[str]:
    """Text the repository ships: the prose, sentences, CoNLL words and SQuAD contexts of
    examples/data, and the demo heads' generated sentiment, NER and QA text (seeded), ~1 MB."""
    import random

    from demo.data import ner_examples, sentiment_examples
    from demo.qa_data import qa_examples

    lines = []
    for path in sorted((EXAMPLES / "corpus").glob("*.txt")):
        lines += path.read_text(encoding="utf-8").splitlines()
    for path in sorted((EXAMPLES / "sentiment").glob("*.tsv")):
        lines += [row.split("\t")[0] for row in path.read_text(encoding="utf-8").splitlines()[1:]]
    for path in sorted((EXAMPLES / "ner").glob("*.conll")):
        text = path.read_text(encoding="utf-8")
        lines += [" ".join(w.split()[0] for w in s.splitlines()) for s in text.split("\n\n")]
    rng = random.Random(0)
    lines += [e["text"] for e in sentiment_examples(3000, rng)]
    lines += [" ".join(e["tokens"]) for e in ner_examples(3000, rng)]
    squad = [json.loads(p.read_text()) for p in sorted((EXAMPLES / "qa").glob("*.json"))]
    for data in [*squad, qa_examples(1500, rng)]:
        for paragraph in (p for article in data["data"] for p in article["paragraphs"]):
            lines += [paragraph["context"], *(qa["question"] for qa in paragraph["qas"])]
    # accents and emoji, so the byte-level and Unigram vocabularies have pieces for them
    lines = [line.strip() for line in lines if line.strip()]
    return lines + ["Café, naïve façade: São Paulo 🙂 Zürich — Ærø"] * 20


# The trained tokenizers are shipped, not trained per run: `tokenizers`' trainers break ties
# between equally frequent merges (and order the alphabet) in hash-map order, which changes from
# one process to the next (two WordPiece trainings: 4 of 1,200 entries and 100 ids differed;
# Unigram differs too), so a test that counts what a random model finds on them passed or failed
# by chance. `python -m tests.families` trains them again (after the shipped text changes).
SHIPPED = Path(__file__).parent / "data" / "tokenizers"


def _tokenizer(kind: str) -> Any:
    """The trained `tokenizers.Tokenizer` of the family kind (see the module docstring), as
    shipped in tests/data/tokenizers."""
    from tokenizers import Tokenizer

    if kind not in _trained:
        _trained[kind] = (SHIPPED / f"{kind}.json").read_text(encoding="utf-8")
    return Tokenizer.from_str(_trained[kind])


def write_tokenizers() -> None:
    """Train every kind on the shipped text and write it to tests/data/tokenizers."""
    SHIPPED.mkdir(parents=True, exist_ok=True)
    for kind in sorted(set(TOKENIZER_KIND.values())):
        (SHIPPED / f"{kind}.json").write_text(_train_tokenizer(kind).to_str() + "\n")
        print(f"wrote {SHIPPED / kind}.json")  # noqa: T201


_trained: dict[str, str] = {}


def _train_tokenizer(kind: str) -> Any:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from tokenizers.processors import RobertaProcessing, TemplateProcessing

    lines = training_lines()
    if kind == "wordpiece":
        specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=False, strip_accents=False)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        trainer = trainers.WordPieceTrainer(vocab_size=VOCAB_SIZE, special_tokens=specials)
    elif kind == "wordpiece-mpnet":
        specials = ["<s>", "<pad>", "</s>", "[UNK]", "<mask>"]
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=True, strip_accents=None)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        trainer = trainers.WordPieceTrainer(vocab_size=VOCAB_SIZE, special_tokens=specials)
    elif kind in ("bpe", "bpe-modernbert"):
        specials = (
            ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
            if kind == "bpe"
            else ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]
        )
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=VOCAB_SIZE,
            special_tokens=specials,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        )
    else:  # unigram, "xlm" (<s> ...), "albert" ([CLS] ..., lowercased) or "deberta" ([CLS] ...)
        specials = {
            "unigram-xlm": ["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
            "unigram-albert": ["<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]"],
            "unigram-deberta": ["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"],
        }[kind]
        tok = Tokenizer(models.Unigram())
        steps = [normalizers.NFKC()] + (
            [normalizers.Lowercase()] if kind == "unigram-albert" else []
        )
        tok.normalizer = normalizers.Sequence(steps)
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
        trainer = trainers.UnigramTrainer(
            vocab_size=VOCAB_SIZE,
            special_tokens=specials,
            unk_token=next(t for t in specials if t in ("<unk>", "[UNK]")),
        )
    tok.train_from_iterator(lines, trainer)
    ids = {t: tok.token_to_id(t) for t in specials}
    if kind == "bpe":
        tok.post_processor = RobertaProcessing(("</s>", ids["</s>"]), ("<s>", ids["<s>"]))
    elif kind in ("unigram-xlm", "wordpiece-mpnet"):
        tok.post_processor = TemplateProcessing(
            single="<s> $A </s>",
            pair="<s> $A </s> </s> $B </s>",
            special_tokens=[("<s>", ids["<s>"]), ("</s>", ids["</s>"])],
        )
    else:
        tok.post_processor = TemplateProcessing(
            single="[CLS] $A [SEP]",
            pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", ids["[CLS]"]), ("[SEP]", ids["[SEP]"])],
        )
    return tok


TOKENIZER_KIND = {
    "bert": "wordpiece",
    "electra": "wordpiece",
    "distilbert": "wordpiece",
    "roberta": "bpe",
    "xlm-roberta": "unigram-xlm",
    "camembert": "unigram-xlm",
    "albert": "unigram-albert",
    "deberta-v2": "unigram-deberta",
    "modernbert": "bpe-modernbert",
    "mpnet": "wordpiece-mpnet",
}


def hf_tokenizer(family: str) -> Any:
    """The family's transformers fast tokenizer class around a trained tokenizer."""
    import transformers

    tok = _tokenizer(TOKENIZER_KIND[family])
    kind = TOKENIZER_KIND[family]
    if kind == "wordpiece":
        specials = dict(unk_token="[UNK]", sep_token="[SEP]", pad_token="[PAD]",
                        cls_token="[CLS]", mask_token="[MASK]")  # fmt: skip
    elif kind == "unigram-albert":
        specials = dict(unk_token="<unk>", sep_token="[SEP]", pad_token="<pad>",
                        cls_token="[CLS]", mask_token="[MASK]")  # fmt: skip
    elif kind in ("unigram-deberta", "bpe-modernbert"):
        specials = dict(unk_token="[UNK]", sep_token="[SEP]", pad_token="[PAD]",
                        cls_token="[CLS]", mask_token="[MASK]")  # fmt: skip
    elif kind == "wordpiece-mpnet":
        specials = dict(bos_token="<s>", eos_token="</s>", unk_token="[UNK]", sep_token="</s>",
                        pad_token="<pad>", cls_token="<s>", mask_token="<mask>")  # fmt: skip
    else:
        specials = dict(bos_token="<s>", eos_token="</s>", unk_token="<unk>", sep_token="</s>",
                        pad_token="<pad>", cls_token="<s>", mask_token="<mask>")  # fmt: skip
    cls = getattr(transformers, f"{CLASS_PREFIX[family]}TokenizerFast", None)
    if cls is None or kind.startswith("unigram") or family == "mpnet":
        # their slow-vocab converters need files; MPNet's resets the normaliser
        cls = transformers.PreTrainedTokenizerFast
    extra: dict[str, Any] = {"do_lower_case": False} if kind == "wordpiece" else {}
    if family in ("modernbert", "mpnet"):  # as their tokenizer_config.json: no token types
        extra["model_input_names"] = ["input_ids", "attention_mask"]
    return cls(tokenizer_object=tok, model_max_length=MAX_POSITIONS, **specials, **extra)


def family_checkpoint(
    family: str,
    task: str,
    *,
    labels: list[str] | None = None,
    seed: int = 0,
    slow_tokenizer: bool = False,
    initializer_range: float = 0.2,
    **config_changes: Any,
) -> Path:
    """A `save_pretrained` folder (model + tokenizer) of `family` with `task`'s head; cached."""
    key = json.dumps(
        [family, task, labels, seed, slow_tokenizer, initializer_range, config_changes],
        sort_keys=True,
        default=str,
    )
    folder = _cache_root / hashlib.sha256(key.encode()).hexdigest()[:16]
    if (folder / "config.json").is_file():
        return folder
    import torch
    import transformers

    if labels is None and task == "classification":
        labels = ["negative", "positive"]
    if labels is None and task == "token-classification":
        labels = NER_LABELS
    tokenizer = hf_tokenizer(family)
    prefix = CLASS_PREFIX[family]
    config_class = getattr(transformers, f"{prefix}Config")
    shape: dict[str, Any] = (
        dict(dim=32, n_layers=2, n_heads=4, hidden_dim=37, max_position_embeddings=MAX_POSITIONS)
        if family == "distilbert"
        else dict(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=37,
            max_position_embeddings=MAX_POSITIONS
            + (2 if family in ("roberta", "xlm-roberta", "camembert") else 0),
        )
    )
    if family in ("roberta", "xlm-roberta", "camembert"):
        shape.update(type_vocab_size=1, pad_token_id=1, bos_token_id=0, eos_token_id=2)
    if family in ("electra", "albert"):
        shape.update(embedding_size=16)
    if family == "mpnet":
        shape.update(max_position_embeddings=MAX_POSITIONS + 2, pad_token_id=1)
    if family == "deberta-v2":  # DeBERTa-v3's choices
        shape.update(relative_attention=True, position_buckets=16, max_relative_positions=64,
                     pos_att_type=["p2c", "c2p"], share_att_key=True, norm_rel_ebd="layer_norm",
                     position_biased_input=False, type_vocab_size=0, pad_token_id=0)  # fmt: skip
    if family == "modernbert":
        ids = tokenizer.convert_tokens_to_ids
        shape.update(num_hidden_layers=3, global_attn_every_n_layers=2, local_attention=16,
                     pad_token_id=ids("[PAD]"), cls_token_id=ids("[CLS]"),
                     sep_token_id=ids("[SEP]"), bos_token_id=ids("[CLS]"),
                     eos_token_id=ids("[SEP]"))  # fmt: skip
    if labels:
        shape.update(
            id2label=dict(enumerate(labels)), label2id={name: i for i, name in enumerate(labels)}
        )
    config = config_class(
        vocab_size=len(tokenizer),
        initializer_range=initializer_range,
        **shape,
        **config_changes,
    )
    model_class = getattr(transformers, prefix + TASK_CLASSES[task])
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = model_class(config).eval()
    staging = Path(tempfile.mkdtemp(dir=_cache_root))
    model.save_pretrained(staging)
    if slow_tokenizer:
        _save_slow(family, tokenizer, staging)
    else:
        tokenizer.save_pretrained(staging)
    staging.rename(folder)
    return folder


def _save_slow(family: str, tokenizer: Any, folder: Path) -> None:
    """The folder as an old `save_pretrained` of a slow tokenizer leaves it: no tokenizer.json."""
    kind = TOKENIZER_KIND[family]
    backend = tokenizer.backend_tokenizer
    vocab = backend.get_vocab(with_added_tokens=True)
    ordered = sorted(vocab, key=vocab.__getitem__)
    if kind == "bpe":
        (folder / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(ordered)}))
        merges = json.loads(backend.to_str())["model"]["merges"]
        lines = [" ".join(m) if isinstance(m, list) else m for m in merges]
        (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(lines) + "\n")
    elif kind == "wordpiece":
        (folder / "vocab.txt").write_text("".join(t + "\n" for t in ordered))
    else:
        raise ValueError(f"no slow format written for {family} (SentencePiece model files)")
    special = {k: v for k, v in tokenizer.special_tokens_map.items() if isinstance(v, str)}
    (folder / "special_tokens_map.json").write_text(json.dumps(special))
    config = {
        "tokenizer_class": f"{CLASS_PREFIX[family]}Tokenizer",
        "model_max_length": MAX_POSITIONS,
    }
    if kind == "wordpiece":
        config["do_lower_case"] = False
    (folder / "tokenizer_config.json").write_text(json.dumps(config | special))


_packages: dict[tuple[Any, ...], Path] = {}


def family_package(
    family: str,
    task: str,
    *,
    seed: int = 0,
    max_seq_length: int | None = None,
    pooling: str | None = None,
) -> Path:
    """`family_checkpoint(family, task, seed=seed)` exported by training.export (fp32), cached
    for the session: the export tests and the served-parity tests share one package each.
    fill-mask, and embedding with pooling "splade", export the family's "masked-lm" folder."""
    key = (family, task, seed, max_seq_length, pooling)
    if key not in _packages:
        from training.export import export_package

        out = _cache_root / "packages" / f"{family}-{task}-{seed}-{max_seq_length}-{pooling}"
        masked_lm = task == "fill-mask" or pooling == "splade"
        folder = family_checkpoint(family, "masked-lm" if masked_lm else task, seed=seed)
        _packages[key] = export_package(
            folder, task, out, max_seq_length=max_seq_length, pooling=pooling, verbose=False
        ).path
    return _packages[key]


if __name__ == "__main__":
    write_tokenizers()
