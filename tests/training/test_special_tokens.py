"""Special tokens read from what a checkpoint declares, in the stated order of authority
(training.special_tokens), never guessed by name where a file says otherwise; and the export
that pads as the checkpoint declares (issue 46).

The tokenizer here is laid out as all-mpnet-base-v2's is: `<s> <pad> </s> <unk>` at ids 0-3,
then a BERT vocabulary with its own `[PAD]` at 4 and `[UNK]`, `<mask>` last; tokenizer.json
pads with `<pad>` (1) to 128, as the published file does.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import AddedToken, Tokenizer, decoders
from tokenizers.models import WordPiece
from tokenizers.normalizers import BertNormalizer
from tokenizers.pre_tokenizers import BertPreTokenizer
from tokenizers.processors import TemplateProcessing

from training.special_tokens import special_tokens
from training.tokenizer import load_tokenizer, mask_token

WORDS = [
    "the",
    "a",
    "of",
    "and",
    "to",
    "in",
    "is",
    "it",
    "was",
    "film",
    "good",
    "bad",
    "cat",
    "sat",
    "on",
    "mat",
    "paris",
    "france",
    "capital",
]


def mpnet_like(folder: Path, padding: bool = True, maps: bool = True, config: dict | None = None):
    """A folder with an all-mpnet-base-v2-shaped tokenizer.json (and, when asked, its
    special_tokens_map.json / tokenizer_config.json / config.json)."""
    vocab = ["<s>", "<pad>", "</s>", "<unk>", "[PAD]", *WORDS, "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab += ["<mask>"]
    tok = Tokenizer(WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]"))
    tok.normalizer = BertNormalizer(lowercase=True)
    tok.pre_tokenizer = BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.add_special_tokens(["<s>", "<pad>", "</s>", "<unk>", "[UNK]"])
    tok.add_special_tokens([AddedToken("<mask>", lstrip=True)])
    tok.post_processor = TemplateProcessing(
        single="<s> $A </s>",
        pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", 0), ("</s>", 2)],
    )
    if padding:
        tok.enable_padding(pad_id=1, pad_token="<pad>", length=128)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    if maps:
        specials = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "[UNK]",
                    "sep_token": "</s>", "pad_token": "<pad>", "cls_token": "<s>",
                    "mask_token": {"content": "<mask>", "lstrip": True}}  # fmt: skip
        (folder / "special_tokens_map.json").write_text(json.dumps(specials))
        config_text = json.dumps({**specials, "mask_token": "<mask>", "do_lower_case": True})
        (folder / "tokenizer_config.json").write_text(config_text)
    if config is not None:
        (folder / "config.json").write_text(json.dumps(config))
    return folder, vocab


def test_the_padding_block_wins_over_the_pad_token_name(tmp_path):
    folder, vocab = mpnet_like(tmp_path / "m", config={"pad_token_id": 1, "bos_token_id": 0})
    found = special_tokens(folder, load_tokenizer(folder))
    assert (found.tokens["pad"], found.ids["pad"]) == ("<pad>", 1)
    assert found.sources["pad"] == "tokenizer.json padding"
    assert vocab.index("[PAD]") == 4  # what a guess by name would have padded with
    assert (found.ids["cls"], found.ids["sep"]) == (0, 2)  # from the post-processor
    assert found.sources["cls"] == "tokenizer.json post-processor"
    assert (found.tokens["mask"], found.tokens["unk"]) == ("<mask>", "[UNK]")
    assert (found.ids["bos"], found.ids["eos"]) == (0, 2)
    assert found.notes == []  # every file agrees


@pytest.mark.parametrize(
    "padding, maps, config, pad, source",
    [
        (False, True, None, 1, "special_tokens_map.json"),
        (False, False, {"pad_token_id": 1}, 1, "config.json"),
        # nothing declares it: a name, the last resort; rows that start with <s> try <pad>
        # first (the vocabulary's BERT [PAD] at 4 is not what such a model pads with)
        (False, False, None, 1, "name"),
    ],
)
def test_each_source_in_its_order(tmp_path, padding, maps, config, pad, source):
    folder, _ = mpnet_like(tmp_path / "m", padding=padding, maps=maps, config=config)
    found = special_tokens(folder, load_tokenizer(folder))
    assert (found.ids["pad"], found.sources["pad"]) == (pad, source)


def test_files_that_disagree_say_which_won(tmp_path):
    folder, _ = mpnet_like(tmp_path / "m", config={"pad_token_id": 4})
    found = special_tokens(folder, load_tokenizer(folder))
    assert found.ids["pad"] == 1
    [note] = found.notes
    assert note == (
        "pad: tokenizer.json padding says <pad> (1); config.json says [PAD] (4); "
        "using tokenizer.json padding's"
    )


def test_a_declared_token_the_tokenizer_lacks_is_passed_over(tmp_path):
    folder, _ = mpnet_like(tmp_path / "m", padding=False, maps=False)
    (folder / "special_tokens_map.json").write_text(json.dumps({"pad_token": "<nope>"}))
    (folder / "config.json").write_text(json.dumps({"pad_token_id": 99999}))
    found = special_tokens(folder, load_tokenizer(folder))
    assert (found.ids["pad"], found.sources["pad"]) == (1, "name")


def test_the_mask_token_is_the_declared_one(tmp_path):
    folder, _ = mpnet_like(tmp_path / "m")  # [MASK] is in its vocabulary too, as in MPNet's
    assert mask_token(load_tokenizer(folder), folder) == "<mask>"
    bare, _ = mpnet_like(tmp_path / "bare", maps=False)
    # by name: <mask> before [MASK], as the rows start with <s>
    assert mask_token(load_tokenizer(bare), bare) == "<mask>"


def test_the_export_pads_with_the_declared_id(tmp_path):
    """A tiny MPNet with this tokenizer: before issue 46 the export refused it ("pads with id 4
    but the model's pad_token_id is 1"); now it records pad 1 and ONNX equals transformers."""
    transformers = pytest.importorskip("transformers")
    import numpy as np
    import torch

    from heads.package import read_package
    from heads.rows import load_package_tokenizer, pad, pad_id
    from heads.tasks.embed import preprocess
    from training.export import export_package

    folder, vocab = mpnet_like(tmp_path / "m")
    config = transformers.MPNetConfig(
        vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=130, pad_token_id=1, bos_token_id=0,
        eos_token_id=2,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.MPNetModel(config).eval().save_pretrained(folder)
    package = read_package(export_package(folder, "embedding", tmp_path / "p", verbose=False).path)
    assert package.special_tokens["pad"] == {
        "token": "<pad>", "id": 1, "source": "tokenizer.json padding"
    }  # fmt: skip

    texts = ["the cat sat on the mat", "paris is the capital of france and it was good film"]
    tok = load_package_tokenizer(package.tokenizer_path)
    feeds = pad(preprocess(tok, texts, package.max_seq_length).sequences, pad_id(1, tok))
    import onnxruntime as ort

    session = ort.InferenceSession(str(package.variant_path("fp32")))
    [ours] = session.run(["embeddings"], {i.name: feeds[i.name] for i in session.get_inputs()})
    hf = transformers.AutoTokenizer.from_pretrained(folder)
    batch = hf(texts, padding=True, return_tensors="pt")
    assert batch["input_ids"][0, -1] == 1  # transformers pads with 1 too
    model = transformers.MPNetModel.from_pretrained(folder).eval()
    with torch.inference_mode():
        states = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    theirs = ((states * mask).sum(1) / mask.sum(1)).numpy()
    assert np.abs(ours - theirs).max() <= 1e-4
