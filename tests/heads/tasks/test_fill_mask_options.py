"""heads.tasks.fill_mask at its edges, against transformers' fill-mask pipeline on the same tiny
folders (tests/families.py): the window limit just inside and out, the padding token filtered
out of the sequences by the package's pad id, special tokens as candidates, targets that are
vocabulary pieces or empty, a SentencePiece tokenizer's clean-up, equal scores, large logits."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from heads.rows import load_package_tokenizer
from heads.tasks import fill_mask
from tests.families import family_checkpoint
from tests.heads.tasks.conftest import refused
from tests.heads.tasks.served import run_job
from tests.heads.tasks.test_fill_mask import SEED, assert_same, package, pipe

transformers = pytest.importorskip("transformers")


def test_a_text_exactly_as_long_as_the_window_is_taken() -> None:
    pkg = package("bert")
    hf = transformers.AutoTokenizer.from_pretrained(
        family_checkpoint("bert", "masked-lm", seed=SEED)
    )
    text = "[MASK]"
    while len(hf(text + " film")["input_ids"]) <= pkg.max_seq_length:
        text += " film"
    assert len(hf(text)["input_ids"]) == pkg.max_seq_length
    run_job(pkg, fill_mask.Job(pkg, [text]))
    longer = len(hf(text + " film")["input_ids"])
    with refused(
        f"inputs[0] is {longer} tokens long, more than the model's max_seq_length "
        f"{pkg.max_seq_length}; shorten it (fill-mask does not truncate)"
    ):
        run_job(pkg, fill_mask.Job(pkg, [text + " film"]))


def test_preprocess_makes_the_pipelines_rows() -> None:
    pkg = package("bert")
    tokenizer = load_package_tokenizer(pkg.tokenizer_path)
    hf = transformers.AutoTokenizer.from_pretrained(
        family_checkpoint("bert", "masked-lm", seed=SEED)
    )
    texts = ["The [MASK] sat.", "[MASK] and [MASK]"]
    rows = fill_mask.preprocess(tokenizer, texts, pkg.max_seq_length, "[MASK]")
    assert [r.input_ids.tolist() for r in rows] == [hf(t)["input_ids"] for t in texts]
    with refused("the model's tokenizer has no mask token '<m>'"):
        fill_mask.preprocess(tokenizer, texts, pkg.max_seq_length, "<m>")


def test_the_padding_token_is_filtered_out_of_the_sequences() -> None:
    """As the pipeline does: a padding token in the text is left out of each `sequence`."""
    pkg, folder = package("bert"), family_checkpoint("bert", "masked-lm", seed=SEED)
    text = "The [PAD] film was [MASK]."
    [ours] = run_job(pkg, fill_mask.Job(pkg, [text], fill_mask.Options(top_k=3)))
    assert_same(ours, pipe(folder)(text, top_k=3))
    assert all("[PAD]" not in x["sequence"] for x in ours)


def test_the_packages_pad_id_is_the_one_filtered() -> None:
    """postprocess takes the pad id it is given; without one it guesses by name."""
    pkg = package("bert")
    tokenizer = load_package_tokenizer(pkg.tokenizer_path)
    # two blanks: the sequences keep their special tokens (the pipeline's), so [PAD] would show
    rows = fill_mask.preprocess(tokenizer, ["The [PAD] film was [MASK] [MASK]."], 128, "[MASK]")
    logits = [np.zeros((len(rows[0]), tokenizer.get_vocab_size()), dtype=np.float32)]
    film = tokenizer.token_to_id("film")
    [[guessed, _]] = fill_mask.postprocess(tokenizer, rows, logits, "[MASK]", top_k=1)
    [[given, _]] = fill_mask.postprocess(tokenizer, rows, logits, "[MASK]", top_k=1, pad_id=film)
    assert "[PAD]" not in guessed[0]["sequence"] and "film" in guessed[0]["sequence"]
    assert "[PAD]" in given[0]["sequence"] and "film" not in given[0]["sequence"]


def test_equal_scores_keep_the_vocabulary_order_and_large_logits_stay_finite() -> None:
    pkg = package("bert")
    tokenizer = load_package_tokenizer(pkg.tokenizer_path)
    rows = fill_mask.preprocess(tokenizer, ["[MASK] and [MASK]"], 128, "[MASK]")
    vocab = tokenizer.get_vocab_size()
    flat = np.zeros((len(rows[0]), vocab), dtype=np.float32)
    [[first, second]] = fill_mask.postprocess(tokenizer, rows, [flat], "[MASK]", top_k=5)
    assert [x["token"] for x in first] == [0, 1, 2, 3, 4] == [x["token"] for x in second]
    assert [x["score"] for x in first] == pytest.approx([1 / vocab] * 5)
    large = flat.copy()
    large[1, 7], large[3, 9] = 1000.0, 5.0  # blank one: one huge logit; blank two: a small one
    [[one, two]] = fill_mask.postprocess(tokenizer, rows, [large], "[MASK]", top_k=1)
    assert (one[0]["token"], one[0]["score"]) == (7, 1.0)
    e = np.exp(5.0)
    assert two[0]["token"] == 9 and two[0]["score"] == pytest.approx(e / (e + vocab - 1))


def test_targets_that_are_pieces_specials_or_empty_as_the_pipeline() -> None:
    pkg, folder = package("bert"), family_checkpoint("bert", "masked-lm", seed=SEED)
    text = "The capital of France is [MASK]."
    targets = ["", "##s", "[CLS]", "film"]
    [ours] = run_job(pkg, fill_mask.Job(pkg, [text], fill_mask.Options(targets=targets)))
    assert_same(ours, pipe(folder)(text, targets=targets))
    tokenizer = load_package_tokenizer(pkg.tokenizer_path)
    assert sorted(x["token"] for x in ours) == sorted(
        tokenizer.token_to_id(t) for t in ("##s", "[CLS]", "film")
    )
    assert "[CLS]" in [x["token_str"] for x in ours]  # a special token is named, not dropped


def test_clean_up_with_a_sentencepiece_tokenizer(tmp_path: Any) -> None:
    """Metaspace decoding leaves " ," and " ." where the text had them; the clean-up, when the
    package asks for it, removes them as transformers' decode does, and only then."""
    import json
    import shutil

    from training.export import export_package

    family = "xlm-roberta"
    text = "Yes , it was <mask> . Really !"
    for clean in (False, True):
        folder = tmp_path / f"ckpt-{clean}"
        shutil.copytree(family_checkpoint(family, "masked-lm", seed=SEED), folder)
        config_path = folder / "tokenizer_config.json"
        config = json.loads(config_path.read_text())
        config_path.write_text(json.dumps(config | {"clean_up_tokenization_spaces": clean}))
        pkg = export_package(folder, "fill-mask", tmp_path / f"pkg-{clean}", verbose=False)
        assert pkg.clean_up_tokenization_spaces is clean
        [ours] = run_job(pkg, fill_mask.Job(pkg, [text], fill_mask.Options(top_k=2)))
        assert_same(ours, pipe(folder)(text, top_k=2))
        assert all((" ," in x["sequence"]) is not clean for x in ours)


def test_refusals_word_for_word() -> None:
    pkg = package("distilbert")
    with refused(
        f"model {pkg.name!r} has no mask token: export it with `python -m training.export "
        "--task fill-mask` from a checkpoint whose tokenizer has one"
    ):
        fill_mask.Job(dataclasses.replace(pkg, mask_token=None), ["a [MASK]"])
    with refused("targets must be a word or a non-empty list of words"):
        fill_mask.Job(pkg, ["a [MASK]"], fill_mask.Options(targets=[]))
