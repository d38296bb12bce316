"""Tokenized corpus -> BERT pretraining batches, following Devlin et al.'s create_pretraining_data.

    documents of sentences (training/data/corpus.py: read, split, tokenized once into a cache)
        ──every epoch──► segment pairs [CLS] A [SEP] B [SEP] (NSP / SOP) or packed segments (MLM)
        ──every batch──► dynamic masking: 15% chosen, 80% [MASK] / 10% random / 10% kept

    >>> corpus = tokenize_corpus(["corpus/"], tokenizer)
    >>> stream = PretrainingStream(corpus, tokenizer, "mlm+nsp", max_seq_length=128, batch_size=32)
    >>> batch = stream.next_batch()   # input_ids, token_type_ids, attention_mask, labels,
    ...                               # next_sentence_label: what BertForPreTraining takes

Objectives: mlm+nsp (BERT, Devlin et al. 2018), mlm+sop (ALBERT, Lan et al. 2019: B is the
true next segment, the negative has A and B swapped) and mlm (RoBERTa, Liu et al. 2019:
full-length packed segments, no second-sentence task).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer
from torch import Tensor

from training.data.corpus import CorpusError, TokenizedCorpus

# Recipe constants.
MASKED_LM_PROB = 0.15  # Devlin et al. 2018 §3.1; create_pretraining_data --masked_lm_prob
MASK_TOKEN_PROB = 0.8  # of the chosen: [MASK] (Devlin et al. 2018 §3.1)
RANDOM_TOKEN_PROB = 0.1  # of the chosen: a random token; the remaining 10% stay unchanged
SHORT_SEQ_PROB = 0.1  # Devlin et al., create_pretraining_data --short_seq_prob
NSP_RANDOM_PROB = 0.5  # "50% of the time B is ... a random sentence" (Devlin et al. 2018 §3.1)
# BERT; RoBERTa (Liu et al. 2019); ALBERT (Lan et al. 2019)
OBJECTIVES = ("mlm+nsp", "mlm", "mlm+sop")
IGNORE_INDEX = -100  # the label of a position that carries no MLM loss


# --- examples: segment pairs and packed segments ----------------------------------------


@dataclass
class Instances:
    """One epoch's examples as token ranges into the cache. Example j is
    `[CLS] piece [SEP] piece [SEP] ...` over pieces[offsets[j] : offsets[j + 1]], each piece a
    row (token start, token end, segment id). labels (N,): 0 = B follows A, 1 = B is random
    (NSP) or A and B are swapped (SOP); -1 for MLM. targets (N,): the target length drawn."""

    pieces: np.ndarray  # (P, 3) int64
    offsets: np.ndarray  # (N + 1,) int64
    labels: np.ndarray  # (N,) int64
    targets: np.ndarray  # (N,) int64

    def __len__(self) -> int:
        return len(self.labels)


def create_instances(
    corpus: TokenizedCorpus,
    objective: str,
    max_seq_length: int,
    rng: random.Random,
    short_seq_prob: float = SHORT_SEQ_PROB,
) -> Instances:
    """Every document's examples, shuffled. Re-run each epoch with a new rng, so the random
    B sentences, the split points and the short targets change (create_pretraining_data's
    dupe_factor, for free)."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}, not {objective!r}")
    if objective == "mlm":
        examples = _packed_segments(corpus, max_seq_length)
    else:
        if objective == "mlm+nsp" and corpus.num_documents < 2:
            raise CorpusError(
                f"{corpus.meta['files'][0]}: next-sentence prediction draws B from another "
                "document, and the corpus has only one (separate documents by blank lines)"
            )
        examples = []
        for d in range(corpus.num_documents):
            examples += _pairs_from_document(
                corpus, d, objective, max_seq_length - 3, rng, short_seq_prob
            )
    rng.shuffle(examples)
    pieces = [p for _, _, ps in examples for p in ps]
    counts = [len(ps) for _, _, ps in examples]
    return Instances(
        pieces=np.asarray(pieces, dtype=np.int64).reshape(-1, 3),
        offsets=np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]),
        labels=np.asarray([label for label, _, _ in examples], dtype=np.int64),
        targets=np.asarray([target for _, target, _ in examples], dtype=np.int64),
    )


Example = tuple[int, int, list[tuple[int, int, int]]]  # (label, target length, pieces)


def _pairs_from_document(
    corpus: TokenizedCorpus,
    doc: int,
    objective: str,
    max_num_tokens: int,
    rng: random.Random,
    short_seq_prob: float,
) -> list[Example]:
    """create_instances_from_document, over token ranges. Sentences are gathered into a chunk
    until it reaches the target length; A is its first 1..n-1 sentences; B is the rest (label
    0), a run from another document (NSP label 1; the unused sentences go back), or the rest
    placed first (SOP label 1). Departures from the original, each with its reason:
    - a one-sentence chunk drawn as label 0 is cut at a random token into A and B, where the
      original forces a random B: with paragraphs as documents, many of one sentence, that
      would tilt NSP well past 50% random;
    - the short target is drawn per chunk, not once per document: with a book as one
      document, the original makes the whole book short or long for an epoch;
    - the random B never comes from the same document (random_segment)."""
    sent = corpus.sentences
    first, last = int(corpus.documents[doc]), int(corpus.documents[doc + 1])
    examples: list[Example] = []

    def draw_target() -> int:
        if rng.random() < short_seq_prob:
            return rng.randint(2, max_num_tokens)
        return max_num_tokens

    target = draw_target()
    chunk_start, length, i = first, 0, first
    while i < last:
        length += int(sent[i + 1] - sent[i])
        if i == last - 1 or length >= target:
            n = i + 1 - chunk_start
            a_end = chunk_start + (1 if n < 2 else rng.randint(1, n - 1))
            a = (int(sent[chunk_start]), int(sent[a_end]))
            label = int(rng.random() < NSP_RANDOM_PROB)
            if objective == "mlm+nsp" and (label or (n < 2 and a[1] - a[0] < 2)):
                label = 1
                b = _random_segment(corpus, doc, target - (a[1] - a[0]), rng)
                i = a_end - 1  # the unused sentences go back (create_pretraining_data)
            elif n < 2:
                if a[1] - a[0] < 2:  # SOP over a one-token chunk: nothing to order
                    a = b = (0, 0)
                else:
                    cut = rng.randint(a[0] + 1, a[1] - 1)
                    a, b = (a[0], cut), (cut, a[1])
            else:
                b = (int(sent[a_end]), int(sent[i + 1]))
            if a[1] > a[0]:
                if objective == "mlm+sop" and label:
                    a, b = b, a
                a, b = _truncate_pair(a, b, max_num_tokens, rng)
                examples.append((label, target, [(a[0], a[1], 0), (b[0], b[1], 1)]))
            chunk_start, length = i + 1, 0
            target = draw_target()
        i += 1
    return examples


def _random_segment(
    corpus: TokenizedCorpus, doc: int, target: int, rng: random.Random
) -> tuple[int, int]:
    """A run of sentences of about `target` tokens from a random document other than `doc`
    (the original retries 10 times and can still hit the same document; we never do)."""
    other = rng.randrange(corpus.num_documents - 1)
    other += other >= doc
    first, last = int(corpus.documents[other]), int(corpus.documents[other + 1])
    start = rng.randint(first, last - 1)
    end = start + 1  # at least one sentence, however little room is left
    while end < last and corpus.sentences[end] - corpus.sentences[start] < target:
        end += 1
    return int(corpus.sentences[start]), int(corpus.sentences[end])


def _truncate_pair(
    a: tuple[int, int], b: tuple[int, int], max_num_tokens: int, rng: random.Random
) -> tuple[tuple[int, int], tuple[int, int]]:
    """truncate_seq_pair: trim the longer side one token at a time, from the front or the back
    at random ("to add more randomness and avoid biases")."""
    (a0, a1), (b0, b1) = a, b
    while (a1 - a0) + (b1 - b0) > max_num_tokens:
        front = rng.random() < 0.5
        if a1 - a0 > b1 - b0:
            a0, a1 = (a0 + 1, a1) if front else (a0, a1 - 1)
        else:
            b0, b1 = (b0 + 1, b1) if front else (b0, b1 - 1)
    return (a0, a1), (b0, b1)


def _packed_segments(corpus: TokenizedCorpus, max_seq_length: int) -> list[Example]:
    """RoBERTa's FULL-SENTENCES (Liu et al. 2019 §4.2): whole sentences packed up to the full
    length, crossing document boundaries with an extra [SEP]; a sentence longer than the whole
    window is cut. All segment ids are 0, there is no second-sentence label."""
    examples: list[Example] = []
    pieces: list[list[int]] = []
    used = 1  # [CLS]
    doc_ends = corpus.document_token_offsets()
    d = 0
    for s in range(len(corpus.sentences) - 1):
        start, end = int(corpus.sentences[s]), int(corpus.sentences[s + 1])
        while start >= doc_ends[d + 1]:
            d += 1
        while start < end:
            new_piece = not pieces or pieces[-1][1] != start or pieces[-1][2] != d
            room = max_seq_length - used - new_piece  # a new piece brings its own [SEP]
            take = min(end - start, room)
            if take < end - start and pieces:  # does not fit whole: close this example
                examples.append((-1, max_seq_length - 2, [(p0, p1, 0) for p0, p1, _ in pieces]))
                pieces, used = [], 1
                continue
            if new_piece:
                pieces.append([start, start + take, d])
                used += take + 1
            else:
                pieces[-1][1] += take
                used += take
            start += take
    if pieces:
        examples.append((-1, max_seq_length - 2, [(p0, p1, 0) for p0, p1, _ in pieces]))
    return examples


# --- batches and masking ----------------------------------------------------------------


@dataclass(frozen=True)
class Vocabulary:
    """What batching and masking need to know about the tokenizer."""

    size: int
    pad: int
    cls: int
    sep: int
    mask: int
    special: tuple[int, ...]  # every special / added token: never chosen, never a replacement
    continuation: np.ndarray  # (V,) bool: the token is a word piece "##..." (whole-word masking)

    @classmethod
    def from_tokenizer(cls, tokenizer: Tokenizer) -> Vocabulary:
        ids = {t: tokenizer.token_to_id(t) for t in ("[PAD]", "[CLS]", "[SEP]", "[MASK]")}
        missing = [t for t, i in ids.items() if i is None]
        if missing:
            raise CorpusError(f"the tokenizer has no {', '.join(missing)}: pretraining needs them")
        size = tokenizer.get_vocab_size(with_added_tokens=True)
        continuation = np.zeros(size, dtype=bool)
        for token, i in tokenizer.get_vocab(with_added_tokens=True).items():
            continuation[i] = token.startswith("##")
        special = set(tokenizer.get_added_tokens_decoder()) | set(ids.values())
        return cls(
            size=size,
            pad=ids["[PAD]"],
            cls=ids["[CLS]"],
            sep=ids["[SEP]"],
            mask=ids["[MASK]"],
            special=tuple(sorted(special)),
            continuation=continuation,
        )


def build_batch(
    corpus: TokenizedCorpus,
    instances: Instances,
    indices: Sequence[int] | np.ndarray,
    vocab: Vocabulary,
    pad_to: int = 0,
) -> dict[str, Tensor]:
    """Examples -> padded (B, T) input_ids, token_type_ids, attention_mask and, for NSP / SOP,
    next_sentence_label (B,). T is the longest example in the batch, or pad_to if longer."""
    rows, types = [], []
    for j in indices:
        ids, segs = [np.array([vocab.cls])], [np.zeros(1, dtype=np.int64)]
        for start, end, seg in instances.pieces[instances.offsets[j] : instances.offsets[j + 1]]:
            ids += [corpus.tokens[start:end], np.array([vocab.sep])]
            segs.append(np.full(end - start + 1, seg))
        rows.append(np.concatenate(ids).astype(np.int64))
        types.append(np.concatenate(segs))
    T = max(pad_to, *(len(r) for r in rows))
    input_ids = torch.full((len(rows), T), vocab.pad, dtype=torch.long)
    token_type_ids = torch.zeros((len(rows), T), dtype=torch.long)
    attention_mask = torch.zeros((len(rows), T), dtype=torch.long)
    for r, (row_ids, row_types) in enumerate(zip(rows, types, strict=True)):
        input_ids[r, : len(row_ids)] = torch.from_numpy(row_ids)
        token_type_ids[r, : len(row_ids)] = torch.from_numpy(row_types)
        attention_mask[r, : len(row_ids)] = 1
    batch = {
        "input_ids": input_ids,
        "token_type_ids": token_type_ids,
        "attention_mask": attention_mask,
    }
    labels = instances.labels[np.asarray(indices)]
    if (labels >= 0).all():
        batch["next_sentence_label"] = torch.from_numpy(labels)
    return batch


def max_predictions(max_seq_length: int, mlm_probability: float) -> int:
    """The most positions Masker chooses in a row of max_seq_length tokens: round(p x n)
    over n <= max_seq_length candidates, at least 1 (create_pretraining_data's
    max_predictions_per_seq, 20 for 128 tokens at 15%)."""
    return max(1, math.ceil(max_seq_length * mlm_probability))


class Masker:
    """Dynamic masking, drawn per batch from its own generator. Per sequence,
    round(15% of its non-special tokens) are chosen (create_pretraining_data's num_to_predict,
    counted over the candidates rather than the whole sequence, optionally capped by
    max_predictions); each chosen token becomes [MASK] (80%), a random non-special token (10%)
    or stays (10%). With whole_word, a word and its ## pieces are chosen together, words taken
    in random order and skipped when they would overshoot the count (as in the original)."""

    def __init__(
        self,
        vocab: Vocabulary,
        mlm_probability: float = MASKED_LM_PROB,
        whole_word: bool = False,
        max_predictions: int | None = None,
    ) -> None:
        self.vocab = vocab
        self.mlm_probability = mlm_probability
        self.whole_word = whole_word
        self.max_predictions = max_predictions
        self.special = torch.tensor(vocab.special, dtype=torch.long)
        keep = np.ones(vocab.size, dtype=bool)
        keep[list(vocab.special)] = False
        self.replacements = torch.from_numpy(np.flatnonzero(keep))
        self.continuation = torch.from_numpy(vocab.continuation)

    def __call__(self, input_ids: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """input_ids (B, T) -> (masked input_ids (B, T), labels (B, T): the original token at
        chosen positions, -100 elsewhere)."""
        B, T = input_ids.shape
        candidates = ~torch.isin(input_ids, self.special)  # (B, T)
        n = candidates.sum(1)
        k = (n.double() * self.mlm_probability).round().long().clamp(min=1)
        if self.max_predictions:
            k = k.clamp(max=self.max_predictions)
        k = torch.where(n > 0, k, 0)  # (B,)
        scores = torch.rand(B, T, generator=generator)
        if self.whole_word:
            chosen = self._choose_words(input_ids, candidates, k, scores)
        else:
            # The k candidates with the lowest random score: k distinct, uniformly drawn.
            scores = scores.masked_fill(~candidates, 2.0)
            rank = scores.argsort(1).argsort(1)
            chosen = rank < k[:, None]

        u = torch.rand(B, T, generator=generator)
        random_ids = self.replacements[
            torch.randint(len(self.replacements), (B, T), generator=generator)
        ]
        masked = input_ids.clone()
        to_mask = chosen & (u < MASK_TOKEN_PROB)
        to_random = chosen & (u >= MASK_TOKEN_PROB) & (u < MASK_TOKEN_PROB + RANDOM_TOKEN_PROB)
        masked[to_mask] = self.vocab.mask
        masked[to_random] = random_ids[to_random]
        labels = torch.where(chosen, input_ids, IGNORE_INDEX)
        return masked, labels

    def _choose_words(
        self, input_ids: Tensor, candidates: Tensor, k: Tensor, scores: Tensor
    ) -> Tensor:
        # A "##" piece right after another candidate continues that candidate's word.
        follows = torch.zeros_like(candidates)
        follows[:, 1:] = candidates[:, :-1]
        inner = candidates & follows & self.continuation[input_ids]  # (B, T)
        starts = candidates & ~inner
        chosen = torch.zeros_like(candidates)
        T = input_ids.shape[1]
        for r in range(len(input_ids)):
            inner_r = inner[r].tolist()
            words = []
            for b in starts[r].nonzero().flatten().tolist():
                e = b + 1
                while e < T and inner_r[e]:
                    e += 1
                words.append((b, e))
            budget = int(k[r])
            starts_r = torch.tensor([b for b, _ in words], dtype=torch.long)
            for w in scores[r, starts_r].argsort().tolist():  # the words in a random order
                b, e = words[w]
                if e - b > budget:
                    continue
                chosen[r, b:e] = True
                budget -= e - b
                if budget == 0:
                    break
        return chosen


class PretrainingStream:
    """An endless, resumable stream of masked batches for one process.

    Epoch e's examples come from create_instances with random.Random(seed, e); process `rank`
    of `world_size` takes every world_size-th of them (rank-strided, equal counts); an
    incomplete last batch is dropped. state_dict() holds the epoch, the position in it and the
    masking generator, which is all a resumed run needs to continue identically."""

    def __init__(
        self,
        corpus: TokenizedCorpus,
        tokenizer: Tokenizer,
        objective: str,
        max_seq_length: int,
        batch_size: int,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        short_seq_prob: float = SHORT_SEQ_PROB,
        whole_word_masking: bool = False,
        mlm_probability: float = MASKED_LM_PROB,
        pad_to_max_length: bool = False,
    ) -> None:
        self.corpus = corpus
        self.objective = objective
        self.max_seq_length = max_seq_length
        self.batch_size = batch_size
        self.seed = seed
        self.rank, self.world_size = rank, world_size
        self.short_seq_prob = short_seq_prob
        self.pad_to = max_seq_length if pad_to_max_length else 0  # one shape for torch.compile
        self.vocab = Vocabulary.from_tokenizer(tokenizer)
        # A cap that never binds (round <= ceil): the bound the model's fixed-size MLM head
        # relies on (BertForPreTraining's max_predictions), stated where it is kept.
        self.max_predictions = max_predictions(max_seq_length, mlm_probability)
        self.masker = Masker(self.vocab, mlm_probability, whole_word_masking, self.max_predictions)
        self.generator = torch.Generator().manual_seed(seed * 1_000_003 + rank)
        self.epoch, self.position = 0, 0
        self._epoch_loaded: int | None = None
        self._instances: Instances | None = None
        self._mine: np.ndarray = np.zeros(0, dtype=np.int64)

    def _load_epoch(self) -> None:
        if self._epoch_loaded == self.epoch:
            return
        rng = random.Random(self.seed * 1_000_003 + self.epoch)
        self._instances = create_instances(
            self.corpus, self.objective, self.max_seq_length, rng, self.short_seq_prob
        )
        per_rank = len(self._instances) // self.world_size
        self._mine = np.arange(self.rank, per_rank * self.world_size, self.world_size)
        if len(self._mine) < self.batch_size:
            raise CorpusError(
                f"the corpus gives {len(self._instances)} examples per epoch, fewer than one "
                f"batch of {self.batch_size} per process: add text or lower --batch-size"
            )
        self._epoch_loaded = self.epoch

    @property
    def batches_per_epoch(self) -> int:
        self._load_epoch()
        return len(self._mine) // self.batch_size

    def next_batch(self) -> dict[str, Tensor]:
        self._load_epoch()
        if self.position + self.batch_size > len(self._mine):
            self.epoch, self.position = self.epoch + 1, 0
            self._load_epoch()
        indices = self._mine[self.position : self.position + self.batch_size]
        self.position += self.batch_size
        assert self._instances is not None
        batch = build_batch(self.corpus, self._instances, indices, self.vocab, self.pad_to)
        batch["input_ids"], batch["labels"] = self.masker(batch["input_ids"], self.generator)
        return batch

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "position": self.position,
            "generator": self.generator.get_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self.generator.set_state(state["generator"])
