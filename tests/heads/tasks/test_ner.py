"""heads.tasks.ner: windows like BertTokenizerFast's overflow, entities like the
token-classification pipeline's, and long texts merged without duplicates or cuts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tokenizers import Tokenizer

from heads.rows import InvalidInput, Outputs, encode
from heads.tasks import ner
from tests.heads.tasks.conftest import (
    NER_LABELS,
    as_lists,
    conll_sentences,
    forward,
    repo_ner_sentences,
)

STRATEGIES = ["none", "simple", "first", "average", "max"]
L = {name: i for i, name in enumerate(NER_LABELS)}


def outputs_for(prepared: ner.WindowedText, token_logits: np.ndarray) -> list[Outputs]:
    """Fake model whose logits per text token are fixed: (T, C) -> one Outputs per window."""
    out = []
    for w in prepared.windows:
        logits = np.zeros((len(w.sequence), token_logits.shape[1]), dtype=np.float32)
        logits[1:-1] = token_logits[w.start : w.stop]
        out.append({"logits": logits})
    return out


def confident(tags: list[str], strength: float = 5.0) -> np.ndarray:
    logits = np.zeros((len(tags), len(NER_LABELS)), dtype=np.float32)
    logits[np.arange(len(tags)), [L[t] for t in tags]] = strength
    return logits


def spans(entities: list[dict], key: str = "entity_group") -> list[tuple[str, int, int]]:
    return [(e[key], e["start"], e["end"]) for e in entities]


# --- preprocess -----------------------------------------------------------------------------


def test_windows_cover_the_text_and_share_stride_tokens(toy_tokenizer: Tokenizer) -> None:
    text = " ".join(["the cats sat in new york city"] * 6)  # 48 tokens
    prepared = ner.preprocess(toy_tokenizer, text, max_seq_length=16, stride=4)
    assert prepared.windowed
    ids = encode(toy_tokenizer, text).ids
    for w in prepared.windows:
        assert len(w.sequence) <= 16
        assert w.sequence.input_ids[1:-1].tolist() == ids[w.start : w.stop].tolist()
        assert [text[a:b] for a, b in w.offsets[1:-1]] == [
            text[a:b] for a, b in prepared.tokens.offsets[w.start : w.stop]
        ]
    starts = [w.start for w in prepared.windows]
    stops = [w.stop for w in prepared.windows]
    assert starts[0] == 0 and stops[-1] == len(ids)
    assert all(b - a == 4 for a, b in zip(starts[1:], stops[:-1], strict=True))  # shared tokens
    with pytest.raises(ValueError, match="stride"):
        ner.preprocess(toy_tokenizer, text, max_seq_length=16, stride=14)
    # a text that fits is one window, whatever the stride
    assert not ner.preprocess(toy_tokenizer, "the cat", 16, stride=14).windowed


def test_the_stride_leaves_new_tokens_in_every_window(toy_tokenizer: Tokenizer) -> None:
    # a window of 16 holds 14 text tokens: it may share 0 to 13 of them with the next
    ner.check_stride(0, 16)
    ner.check_stride(13, 16)
    for stride in (14, -1):
        with pytest.raises(
            InvalidInput,
            match=rf"stride \({stride}\) must be smaller than the window's 14 text tokens",
        ):
            ner.check_stride(stride, 16)
    assert [ner.default_stride(n) for n in (130, 512, 6)] == [32, 127, 1]  # a quarter
    # one text token per window is the least: [CLS] and [SEP] take the rest
    assert len(ner.preprocess(toy_tokenizer, "the cat sat", 3, 0).windows) == 3
    with pytest.raises(ValueError, match="no room"):
        ner.preprocess(toy_tokenizer, "the cat sat", 2, 0)


def test_sure_logits_stay_finite(toy_tokenizer: Tokenizer) -> None:
    """Logits of 100 (fp16 graphs reach such values) give probabilities, not overflow."""
    prepared = ner.preprocess(toy_tokenizer, "the cats sat in paris", 32, 8)
    outputs = outputs_for(prepared, confident(["O", "B-PER", "B-PER", "O", "O", "B-LOC"], 100.0))
    for strategy in STRATEGIES:
        entities = ner.postprocess(prepared, outputs, NER_LABELS, strategy)
        assert entities and all(e["score"] == pytest.approx(1.0) for e in entities), strategy


@pytest.mark.parametrize("text", ["", "   ", "\n\t ", "\x07\x00"])
def test_empty_texts_have_one_empty_row_and_no_entities(
    toy_tokenizer: Tokenizer, text: str
) -> None:
    prepared = ner.preprocess(toy_tokenizer, text, 16, 4)
    assert len(prepared.sequences) == 1 and len(prepared.sequences[0]) == 2
    outputs = [{"logits": np.ones((2, len(NER_LABELS)), dtype=np.float32)}]
    for strategy in STRATEGIES:
        assert ner.postprocess(prepared, outputs, NER_LABELS, strategy) == []


# --- postprocess on hand-made logits --------------------------------------------------------


def test_grouping_by_b_and_i_tags(toy_tokenizer: Tokenizer) -> None:
    text = "the cats sat in new york city"  # the cat ##s sat in new york city
    prepared = ner.preprocess(toy_tokenizer, text, 32, 8)
    tags = ["O", "B-PER", "I-PER", "O", "I-LOC", "B-LOC", "I-LOC", "B-LOC"]
    outputs = outputs_for(prepared, confident(tags))
    simple = ner.postprocess(prepared, outputs, NER_LABELS, "simple")
    # an I- tag after O opens a group, a B- tag always does
    assert spans(simple) == [("PER", 4, 8), ("LOC", 13, 15), ("LOC", 16, 24), ("LOC", 25, 29)]
    assert [e["word"] for e in simple] == ["cats", "in", "new york", "city"]
    p = np.exp(5.0) / (np.exp(5.0) + len(NER_LABELS) - 1)
    assert all(
        e["score"] == pytest.approx(p, abs=1e-6) and type(e["score"]) is float for e in simple
    )

    none = ner.postprocess(prepared, outputs, NER_LABELS, "none")
    assert [(e["entity"], e["index"], e["word"]) for e in none][:2] == [
        ("B-PER", 2, "cat"),
        ("I-PER", 3, "s"),
    ]
    assert len(none) == 6
    # nothing ignored: the O tokens come back too, and the O run groups like any tag
    everything = ner.postprocess(prepared, outputs, NER_LABELS, "simple", ignore_labels=[])
    assert spans(everything)[0] == ("O", 0, 3)
    assert spans(
        ner.postprocess(prepared, outputs, NER_LABELS, "simple", ignore_labels=["O", "LOC"])
    ) == [("PER", 4, 8)]
    with pytest.raises(InvalidInput, match="aggregation_strategy"):
        ner.postprocess(prepared, outputs, NER_LABELS, "longest")


def test_word_strategies_make_a_words_tokens_agree(toy_tokenizer: Tokenizer) -> None:
    text = "the cats sat"  # the cat ##s sat
    prepared = ner.preprocess(toy_tokenizer, text, 32, 8)
    logits = np.zeros((4, len(NER_LABELS)), dtype=np.float32)
    logits[1, L["B-PER"]] = 2.0  # "cat": PER, not sure
    logits[2, L["B-LOC"]] = 6.0  # "##s": LOC, sure
    outputs = outputs_for(prepared, logits)
    assert spans(ner.postprocess(prepared, outputs, NER_LABELS, "simple")) == [
        ("PER", 4, 7),
        ("LOC", 7, 8),
    ]
    assert spans(ner.postprocess(prepared, outputs, NER_LABELS, "first")) == [("PER", 4, 8)]
    assert spans(ner.postprocess(prepared, outputs, NER_LABELS, "max")) == [("LOC", 4, 8)]
    average = ner.postprocess(prepared, outputs, NER_LABELS, "average")
    probs = np.exp(logits[1:3]) / np.exp(logits[1:3]).sum(-1, keepdims=True)
    mean = probs.mean(0)
    assert spans(average) == [(NER_LABELS[int(mean.argmax())][2:], 4, 8)]
    assert average[0]["score"] == pytest.approx(float(mean.max()), abs=1e-6)


def test_a_word_shortened_by_normalisation_still_starts_a_word(toy_tokenizer: Tokenizer) -> None:
    """ "c\x07at" is one token "cat" over 4 characters. The pipeline's length test would call it
    a subword and glue it to "the"; the WordPiece `##` marker says it starts a word."""
    text = "the c\x07at sat"
    prepared = ner.preprocess(toy_tokenizer, text, 32, 8)
    assert [text[a:b] for a, b in prepared.tokens.offsets] == ["the", "c\x07at", "sat"]
    outputs = outputs_for(prepared, confident(["B-PER", "B-LOC", "O"]))
    for strategy in ("first", "average", "max"):
        entities = ner.postprocess(prepared, outputs, NER_LABELS, strategy)
        assert [(e["entity_group"], e["word"]) for e in entities] == [
            ("PER", "the"),
            ("LOC", "c\x07at"),
        ]


def test_many_entities_each_word_strategy_names_each_once(toy_tokenizer: Tokenizer) -> None:
    """Five entities in one text, two of them words of two tokens whose second token says
    something else: every word strategy names each entity once, with its whole word."""
    text = "the cats sat in paris , new york , france , dogs ran"
    prepared = ner.preprocess(toy_tokenizer, text, 64, 8)
    pieces = [text[a:b] for a, b in prepared.tokens.offsets]
    assert pieces[1:3] == ["cat", "s"] and pieces[-3:-1] == ["dog", "s"]
    tags = ["O", "B-PER", "B-LOC", "O", "O", "B-LOC", "O", "B-ORG", "I-ORG", "O", "B-MISC"]
    tags += ["O", "B-PER", "B-LOC", "O"]
    logits = confident(tags)
    logits[2] = logits[13] = confident(["B-LOC"], strength=3.0)  # "##s": less sure than "cat"
    outputs = outputs_for(prepared, logits)
    want = [("PER", "cats"), ("LOC", "paris"), ("ORG", "new york"), ("MISC", "france"),
            ("PER", "dogs")]  # fmt: skip
    for strategy in ("first", "average", "max"):
        entities = ner.postprocess(prepared, outputs, NER_LABELS, strategy)
        assert [(e["entity_group"], e["word"]) for e in entities] == want, strategy
    # "simple" reads tokens, not words: "##s" is a LOC of its own, and the text has 7 entities
    simple = ner.postprocess(prepared, outputs, NER_LABELS, "simple")
    assert [e["word"] for e in simple] == ["cat", "s", "paris", "new york", "france", "dog", "s"]


@pytest.fixture(scope="module")
def pipeline_postprocess(toy_tokenizer: Tokenizer, tiny_model: Any) -> Any:
    """pipeline_postprocess(prepared, logits (T, C), strategy) -> the entities that
    transformers' token-classification pipeline makes of these token logits for the whole
    text in one row: an independent reference for hand-made logits."""
    transformers = pytest.importorskip("transformers")
    from transformers.pipelines.token_classification import AggregationStrategy

    hf = transformers.PreTrainedTokenizerFast(
        tokenizer_object=toy_tokenizer, unk_token="[UNK]", cls_token="[CLS]",
        sep_token="[SEP]", pad_token="[PAD]", mask_token="[MASK]",
    )  # fmt: skip
    model = tiny_model(
        "BertForTokenClassification", toy_tokenizer.get_vocab_size(),
        id2label=dict(enumerate(NER_LABELS)), label2id=L,
    )  # fmt: skip
    pipe = transformers.pipeline("token-classification", model=model, tokenizer=hf)

    def run(prepared: ner.WindowedText, logits: np.ndarray, strategy: str) -> list[dict]:
        import torch

        assert not prepared.windowed
        (w,) = prepared.windows
        row = outputs_for(prepared, logits)[0]["logits"]
        out = {
            "logits": torch.from_numpy(row)[None],
            "sentence": prepared.text,
            "input_ids": torch.from_numpy(w.sequence.input_ids)[None],
            "offset_mapping": torch.from_numpy(w.offsets)[None],
            "special_tokens_mask": torch.tensor([[1] + [0] * (w.stop - w.start) + [1]]),
            "is_last": True,
        }
        return pipe.postprocess([out], aggregation_strategy=AggregationStrategy[strategy.upper()])

    return run


def test_long_texts_merge_to_what_one_window_gives(
    toy_tokenizer: Tokenizer, pipeline_postprocess: Any
) -> None:
    """With logits that depend on the token alone, windows must stitch back exactly: any entity
    cut at a window edge, or counted twice in an overlap, would show up as a difference. The
    one-window answer is itself checked against the pipeline's grouping of the same logits."""
    text = " ".join(["the cats sat in new york city, paris is in france."] * 8)
    whole = ner.preprocess(toy_tokenizer, text, 512, 0)
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 2, (len(whole.tokens), len(NER_LABELS))).astype(np.float32)
    for strategy in STRATEGIES:
        reference = ner.postprocess(whole, outputs_for(whole, logits), NER_LABELS, strategy)
        key = "entity" if strategy == "none" else "entity_group"
        theirs = pipeline_postprocess(whole, logits, strategy)
        assert spans(reference, key) == spans(theirs, key), strategy
        assert [e["score"] for e in reference] == pytest.approx(
            [float(e["score"]) for e in theirs], abs=1e-6
        )
        assert len(reference) > 20, strategy  # many entities: none lost, none repeated
    for max_len, stride in [(16, 4), (12, 0), (20, 9), (32, 8)]:
        windowed = ner.preprocess(toy_tokenizer, text, max_len, stride)
        assert len(windowed.windows) > 2
        for strategy in STRATEGIES:
            ours = ner.postprocess(windowed, outputs_for(windowed, logits), NER_LABELS, strategy)
            reference = ner.postprocess(whole, outputs_for(whole, logits), NER_LABELS, strategy)
            assert ours == reference


@pytest.mark.parametrize(
    ("stride", "windows", "chosen"),
    [
        # overlap 6..9: 6, 7 have more context in window 0, 8, 9 in window 1; the text's end
        # is no cut, so token 18 stays in window 2 although it opens window 3
        (4, [(0, 10), (6, 16), (12, 22), (18, 24)], [0] * 8 + [1] * 6 + [2] * 6 + [3] * 4),
        # odd overlaps tie in the middle (token 7: two tokens of context in either window):
        # the earlier window wins
        (5, [(0, 10), (5, 15), (10, 20), (15, 24)], [0] * 8 + [1] * 5 + [2] * 5 + [3] * 6),
    ],
)
def test_each_token_is_read_where_it_has_most_context(
    toy_tokenizer: Tokenizer, stride: int, windows: list[tuple[int, int]], chosen: list[int]
) -> None:
    text = " ".join(["the cat sat on the mat"] * 4)  # 24 tokens
    prepared = ner.preprocess(toy_tokenizer, text, 12, stride)  # windows of 10 tokens
    assert [(w.start, w.stop) for w in prepared.windows] == windows
    # window k says "label k" for every token, so the scores show which window was read
    outputs = [
        {"logits": np.eye(len(NER_LABELS), dtype=np.float32)[[k] * len(w.sequence)] * 9}
        for k, w in enumerate(prepared.windows)
    ]
    assert ner.token_scores(prepared, outputs).argmax(-1).tolist() == chosen


# --- parity with transformers' pipeline on CoNLL sentences ---------------------------------


@pytest.fixture(scope="module")
def ner_model(tiny_model: Any, hf_cased: Any) -> Any:
    return tiny_model(
        "BertForTokenClassification",
        hf_cased.vocab_size,
        seed=1,
        id2label=dict(enumerate(NER_LABELS)),
        label2id=L,
    )


UNICODE_TEXTS = [
    "Café\u0301 owner José Müller met Zoë in São Paulo 😀 yesterday",
    "東京 and 北京 are cities ; Ελλάδα is Greece",
    "Control\x07 char and\u200b zero width and ﬁne ligature",
]


@pytest.mark.shared
def test_same_entities_as_the_pipeline(
    tok_cased: Tokenizer, hf_cased: Any, ner_model: Any, shared_data: Path
) -> None:
    from transformers import pipeline

    texts = conll_sentences(shared_data, 60)
    found = 0
    for strategy in STRATEGIES:
        pipe = pipeline(
            "token-classification",
            model=ner_model,
            tokenizer=hf_cased,
            aggregation_strategy=strategy,
        )
        key = "entity" if strategy == "none" else "entity_group"
        for text in texts + UNICODE_TEXTS:
            prepared = ner.preprocess(tok_cased, text, 128, 16)
            assert as_lists(prepared.sequences) == [hf_cased(text)["input_ids"]]
            ours = ner.postprocess(
                prepared, [forward(ner_model, s) for s in prepared.sequences], NER_LABELS, strategy
            )
            theirs = pipe(text)
            assert spans(ours, key) == spans(theirs, key), text
            assert [e["score"] for e in ours] == pytest.approx(
                [float(e["score"]) for e in theirs], abs=1e-4
            )
            assert all(e["word"] == text[e["start"] : e["end"]] for e in ours)
            if strategy == "none":
                assert [e["index"] for e in ours] == [e["index"] for e in theirs]
            found += len(ours)
    assert found > 500  # the random model does name things: the comparison is not vacuous


def test_same_entities_as_the_pipeline_on_shipped_text(
    tok_repo: Tokenizer, hf_repo: Any, tiny_model: Any
) -> None:
    """The fresh-clone twin of the test above: the sentences of examples/data/ner and the
    demo's generated ones, alone and two at a time (many entities per text), with a tokenizer
    trained on the repository's text (most names cut into `##` pieces)."""
    from transformers import pipeline

    model = tiny_model(
        "BertForTokenClassification", len(hf_repo), seed=1,
        id2label=dict(enumerate(NER_LABELS)), label2id=L,
    )  # fmt: skip
    sentences = repo_ner_sentences(60)
    pairs = zip(sentences[30::2], sentences[31::2], strict=True)
    texts = sentences[:30] + [f"{a} {b}" for a, b in pairs]
    texts += UNICODE_TEXTS
    found = crowded = 0
    for strategy in STRATEGIES:
        pipe = pipeline(
            "token-classification", model=model, tokenizer=hf_repo, aggregation_strategy=strategy
        )
        key = "entity" if strategy == "none" else "entity_group"
        for text in texts:
            prepared = ner.preprocess(tok_repo, text, 128, 16)
            assert as_lists(prepared.sequences) == [hf_repo(text)["input_ids"]]
            outputs = [forward(model, s) for s in prepared.sequences]
            ours = ner.postprocess(prepared, outputs, NER_LABELS, strategy)
            theirs = pipe(text)
            assert spans(ours, key) == spans(theirs, key), (strategy, text)
            assert [e["score"] for e in ours] == pytest.approx(
                [float(e["score"]) for e in theirs], abs=1e-4
            )
            assert all(e["word"] == text[e["start"] : e["end"]] for e in ours)
            if strategy == "none":
                assert [e["index"] for e in ours] == [e["index"] for e in theirs]
            found += len(ours)
            crowded += strategy in ("first", "average", "max") and len(ours) > 2
    assert found > 500, found  # the random model does name things: not a vacuous comparison
    assert crowded >= 12, crowded  # texts with more than two entities (first, average, max)


@pytest.mark.shared
def test_long_texts_against_the_pipelines_windows(
    tok_cased: Tokenizer, hf_cased: Any, ner_model: Any, shared_data: Path
) -> None:
    """The windows are the pipeline's (`stride=8` on a 32-token model). The merged entities
    differ from the pipeline's by design (it labels windows apart and keeps the longest
    overlapping entity), so this checks our invariants instead."""
    sentences = conll_sentences(shared_data, 120, min_words=8)
    texts = [" ".join(sentences[i : i + 3]) for i in range(0, 60, 3)] + UNICODE_TEXTS
    n_windowed = 0
    for text in texts:
        prepared = ner.preprocess(tok_cased, text, 32, 8)
        hf = hf_cased(
            text, truncation=True, max_length=32, stride=8, return_overflowing_tokens=True
        )
        assert as_lists(prepared.sequences) == hf["input_ids"]
        n_windowed += prepared.windowed
        outputs = [forward(ner_model, s) for s in prepared.sequences]
        for strategy in STRATEGIES:
            entities = ner.postprocess(prepared, outputs, NER_LABELS, strategy)
            bounds = [(e["start"], e["end"]) for e in entities]
            assert bounds == sorted(bounds)
            assert all(a[1] <= b[0] for a, b in zip(bounds, bounds[1:], strict=False))  # no overlap
            assert all(
                e["word"] == text[e["start"] : e["end"]] and e["start"] < e["end"] for e in entities
            )
            starts, ends = set(prepared.tokens.offsets[:, 0]), set(prepared.tokens.offsets[:, 1])
            assert all(s in starts and e in ends for s, e in bounds)
        # a text that fits one window: the windowed path is the single-window path
    short = sentences[0]
    one = ner.preprocess(tok_cased, short, 128, 8)
    assert not one.windowed
    outputs = [forward(ner_model, s) for s in one.sequences]
    assert ner.postprocess(one, outputs, NER_LABELS) == ner.postprocess(
        ner.preprocess(tok_cased, short, 512, 0), outputs, NER_LABELS
    )
    assert n_windowed >= 20
