"""heads.tasks.fill_mask: answers like transformers' fill-mask pipeline, through the exported
package (tiny random *ForMaskedLM folders of BERT, RoBERTa and DistilBERT: WordPiece [MASK]
and byte-level BPE <mask>; tests/families.py), and clear refusals."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from heads.package import ModelPackage, read_package
from heads.rows import InvalidInput, load_package_tokenizer
from heads.tasks import fill_mask
from tests.families import family_checkpoint, family_package, hf_tokenizer
from tests.heads.tasks.served import run_job

transformers = pytest.importorskip("transformers")
pytest.importorskip("torch")

SEED = 5  # tests/training/test_masked_lm.py's: one export per family for both
FAMILIES = ("bert", "roberta", "distilbert")
TOL = 1e-5


def package(family: str) -> ModelPackage:
    return read_package(family_package(family, "fill-mask", seed=SEED))


def pipe(folder: Path) -> Any:
    return transformers.pipeline("fill-mask", model=str(folder), device="cpu")


def texts(family: str) -> dict[str, list[str]]:
    """One blank and several, of different lengths (so the batch pads)."""
    m = hf_tokenizer(family).mask_token
    return {
        "single": [
            f"The capital of France is {m}.",
            f"{m} visited Paris in June.",
            f"I loved this film, it was {m}! Really, it was.",
        ],
        "several": [f"{m} visited {m} in June with two {m} friends.", f"The {m} sat on {m}."],
    }


def assert_same(ours: list[dict], theirs: list[dict]) -> None:
    """One blank's candidates: same tokens, strings and sequences, scores within TOL."""
    keys = ("token", "token_str", "sequence")
    assert [{k: x[k] for k in keys} for x in ours] == [{k: x[k] for k in keys} for x in theirs]
    assert [x["score"] for x in ours] == pytest.approx([x["score"] for x in theirs], abs=TOL)


def answers(pkg: ModelPackage, inputs: list[str], **options: Any) -> list[Any]:
    return run_job(pkg, fill_mask.Job(pkg, inputs, fill_mask.Options(**options)))


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("top_k", [None, 1, 3])
def test_single_blanks_match_the_pipeline(family: str, top_k: int | None) -> None:
    pkg, reference = package(family), pipe(family_checkpoint(family, "masked-lm", seed=SEED))
    options = {} if top_k is None else {"top_k": top_k}
    inputs = texts(family)["single"]
    ours = answers(pkg, inputs, **options)
    for text, answer in zip(inputs, ours, strict=True):
        theirs = reference(text, **options)
        assert len(answer) == (top_k or fill_mask.TOP_K)
        assert isinstance(answer[0], dict)  # one blank: a flat list, as the pipeline's
        assert_same(answer, theirs)


@pytest.mark.parametrize("family", FAMILIES)
def test_several_blanks_answer_one_list_each(family: str) -> None:
    pkg, reference = package(family), pipe(family_checkpoint(family, "masked-lm", seed=SEED))
    inputs = texts(family)["several"]
    for text, answer in zip(inputs, answers(pkg, inputs, top_k=2), strict=True):
        theirs = reference(text, top_k=2)
        assert len(answer) == len(theirs) == text.count(hf_tokenizer(family).mask_token)
        for blank, their_blank in zip(answer, theirs, strict=True):
            assert_same(blank, their_blank)
        # the other blanks stay visible in each sequence, special tokens too (the pipeline's)
        assert hf_tokenizer(family).mask_token in answer[0][0]["sequence"]


@pytest.mark.parametrize("family", FAMILIES)
def test_targets_restrict_the_scores_as_the_pipeline_does(family: str) -> None:
    pkg, reference = package(family), pipe(family_checkpoint(family, "masked-lm", seed=SEED))
    tokenizer = load_package_tokenizer(pkg.tokenizer_path)
    vocab = tokenizer.get_vocab()
    # words in the vocabulary, words that are not (scored by their first token, repeats once),
    # and one that makes no token at all (skipped)
    targets = ["the", "Paris", "city", "film", "extraordinarily", "Paris", ""]
    multi = tokenizer.encode("extraordinarily", add_special_tokens=False).ids
    assert "extraordinarily" not in vocab and len(multi) > 1
    scored = fill_mask.target_ids(tokenizer, targets)
    assert len(scored) == 5 and multi[0] in scored  # 7 words: a repeat and an empty one gone
    inputs = texts(family)["single"][:2] + texts(family)["several"][:1]
    for top_k in (fill_mask.TOP_K, 2):
        ours = answers(pkg, inputs, targets=targets, top_k=top_k)
        for text, answer in zip(inputs, ours, strict=True):
            theirs = reference(text, targets=targets, top_k=top_k)
            for blank, their_blank in zip(
                answer if isinstance(answer[0], list) else [answer],
                theirs if isinstance(theirs[0], list) else [theirs],
                strict=True,
            ):
                assert_same(blank, their_blank)
                if top_k == fill_mask.TOP_K:  # every target scored, the long word by its first
                    assert sorted(x["token"] for x in blank) == sorted(scored.tolist())
    # one target word as a string, as the pipeline takes it
    [one] = answers(pkg, inputs[:1], targets="film")
    assert len(one) == 1
    assert_same(one, reference(inputs[0], targets="film"))


def test_preprocess_and_postprocess_are_the_jobs_steps() -> None:
    pkg = package("bert")
    tokenizer = load_package_tokenizer(pkg.tokenizer_path)
    inputs = texts("bert")["single"][:1]
    rows = fill_mask.preprocess(tokenizer, inputs, pkg.max_seq_length, "[MASK]")
    rng = np.random.default_rng(0)
    logits = [rng.normal(size=(len(r), tokenizer.get_vocab_size())) for r in rows]
    [answer] = fill_mask.postprocess(tokenizer, rows, logits, "[MASK]", top_k=2)
    position = int(np.flatnonzero(rows[0].input_ids == tokenizer.token_to_id("[MASK]"))[0])
    best = np.argsort(-logits[0][position])[:2]
    assert [x["token"] for x in answer] == best.tolist()
    e = np.exp(logits[0][position] - logits[0][position].max())
    assert answer[0]["score"] == pytest.approx(e[best[0]] / e.sum(), abs=1e-12)


def test_clean_up_follows_the_tokenizer_config(tmp_path: Path) -> None:
    """A folder whose tokenizer_config.json says clean_up_tokenization_spaces: the package
    records it and the sequences lose the space before punctuation, as the pipeline's."""
    from training.export import export_package

    folder = tmp_path / "ckpt"
    shutil.copytree(family_checkpoint("bert", "masked-lm", seed=SEED), folder)
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps(config | {"clean_up_tokenization_spaces": True}))
    pkg = export_package(folder, "fill-mask", tmp_path / "pkg", verbose=False)
    assert pkg.clean_up_tokenization_spaces is True
    inputs = texts("bert")["single"]
    reference = pipe(folder)
    for text, answer in zip(inputs, answers(pkg, inputs), strict=True):
        assert_same(answer, reference(text))
    assert all(" ." not in x["sequence"] for x in answers(pkg, inputs[:1])[0])
    sample = "it was n't me , he 's here . are you ? yes ! i 'm , we 're , they 've"
    assert fill_mask.clean_up(sample) == transformers.PreTrainedTokenizerBase.clean_up_tokenization(
        sample
    )


# --- refusals -------------------------------------------------------------------------------


def test_a_text_without_a_blank_is_refused() -> None:
    pkg = package("roberta")
    job = fill_mask.Job(pkg, ["The capital of France is <mask>.", "No blank here"])
    with pytest.raises(InvalidInput, match=r"inputs\[1\] has no mask token <mask>"):
        run_job(pkg, job)


def test_a_text_longer_than_the_window_is_refused_with_the_limit() -> None:
    pkg = package("bert")
    long_text = "[MASK] " + "the film was good and " * 40
    with pytest.raises(
        InvalidInput,
        match=rf"inputs\[0\] is \d+ tokens long, more than the model's max_seq_length "
        rf"{pkg.max_seq_length}; shorten it \(fill-mask does not truncate\)",
    ):
        run_job(pkg, fill_mask.Job(pkg, [long_text]))


def test_bad_options_and_a_package_without_a_mask_token_are_refused() -> None:
    pkg = package("distilbert")
    with pytest.raises(InvalidInput, match="has no mask token: export it"):
        fill_mask.Job(dataclasses.replace(pkg, mask_token=None), ["a [MASK]"])
    for top_k in (0, -1, 1.5, True):
        with pytest.raises(InvalidInput, match="top_k must be an integer of at least 1"):
            fill_mask.Job(pkg, ["a [MASK]"], fill_mask.Options(top_k=top_k))  # type: ignore[arg-type]
    for targets in ([], [1], 3):
        with pytest.raises(InvalidInput, match="targets must be a word"):
            fill_mask.Job(pkg, ["a [MASK]"], fill_mask.Options(targets=targets))  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="none of them is or makes a token"):
        run_job(pkg, fill_mask.Job(pkg, ["a [MASK]"], fill_mask.Options(targets=["", " "])))
    with pytest.raises(InvalidInput, match=r"inputs\[0\]: expected a string"):
        fill_mask.Job(pkg, [("a", "b")])  # type: ignore[list-item]
