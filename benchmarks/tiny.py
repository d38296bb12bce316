"""Tiny model packages for the tests and the soak's `--tiny` mode, built through the real exporter
(`training.export`). Here, not under tests/, because benchmarks never import tests.

    >>> pkg = build_tiny_package(tmp_path / "sst2", "classification")
    >>> pkg = build_tiny_package(tmp_path / "ner", "token-classification", checkpoint_dir=tmp_path / "ckpt")

The model is a random BERT (hidden 32, 2 layers, 4 heads, FFN 37) over a small uncased
WordPiece vocabulary built here from the words below, so no test needs ../shared. Its outputs
are meaningless but deterministic for a seed; what the tests check is plumbing and parity.
At BERT's initializer_range 0.02 it scores every input alike (64 sentences within 2e-5 of each
other); tests that compare answers across requests build it with `initializer_range=0.3`
(STANDIN_RANGE), whose answers differ by input (64 varied sentences: scores 0.13-0.89, no two
within 4e-4), so a swapped answer shows.
Packages are cached per argument set for the session and copied, so a second call is cheap.
"""

from __future__ import annotations

import atexit
import hashlib
import shutil
import tempfile
from pathlib import Path

import torch
from tokenizers import Tokenizer

from heads.package import ModelPackage, read_package
from training.config import BertConfig
from training.export import export_package
from training.model import HEADS
from training.tokenizer import SPECIAL_TOKENS, load_tokenizer

_WORD_TEXT = """
the a an and or but not no yes of to in on at by for with from about as into over after before
is are was were be been being has have had do does did will would can could should may might
it its this that these those there here he she they we you i me him her them us my your our
their who what when where why how which whose one two three four five six seven eight nine ten
first second last next new old good bad great terrible wonderful awful boring brilliant funny
sad happy dull charming moving beautiful ugly smart stupid best worst better worse love hate
like enjoy enjoyed loved hated film movie story plot actor actress director scene scenes music
ending character characters performance script cast time year years day days week life world
people man woman child children city country river mountain sea island north south east west
paris london berlin tokyo rome madrid vienna cairo delhi lima oslo peru japan france germany
italy spain egypt india china brazil kenya canada norway john mary peter anna james maria paul
sarah david laura michael emma thomas alice robert clara george lucy henry sophie reuters nasa
google apple microsoft siemens toyota unesco fifa nato bank company university government
party council team club league union army police court school hospital museum newspaper
said says told asked answered wrote written write read reading born died lived lives live
won lost win lose play played playing plays game match season cup final goal goals score
built build founded capital largest smallest population president minister king queen leader
war peace treaty law rule rules money price market stock oil gas water fire earth air light
dark night morning evening red blue green white black big small long short high low early late
very really quite too so more most less least much many few some any all every each other
"""
WORDS = _WORD_TEXT.split()
SUFFIXES = ["##s", "##es", "##ed", "##ing", "##er", "##est", "##ly", "##n", "##ian", "##ese"]
CHARS = list("abcdefghijklmnopqrstuvwxyz0123456789.,;:!?'\"()-")
DEFAULT_LABELS = {
    "classification": ["negative", "positive"],
    "token-classification": [
        "O",
        "B-PER",
        "I-PER",
        "B-ORG",
        "I-ORG",
        "B-LOC",
        "I-LOC",
        "B-MISC",
        "I-MISC",
    ],
}
# The stand-in for answers that must tell requests apart (see the module docstring).
STANDIN_RANGE = 0.3
HF_PROBLEM_TYPES = {
    "single_label": "single_label_classification",
    "multi_label": "multi_label_classification",
    "regression": "regression",
}

_cache_root = Path(tempfile.mkdtemp(prefix="bert-heads-packages-"))
atexit.register(shutil.rmtree, _cache_root, True)
_cache: dict[str, Path] = {}


def tiny_vocabulary() -> list[str]:
    """Specials first ([PAD] = 0), then words, suffixes, and every character alone and as a
    continuation, so that any ASCII text tokenizes without [UNK]."""
    tokens = [*SPECIAL_TOKENS, *WORDS, *SUFFIXES, *CHARS, *(f"##{c}" for c in CHARS)]
    return list(dict.fromkeys(tokens))  # "a" and "i" are words and characters


def tiny_tokenizer(directory: Path | None = None) -> Tokenizer:
    """The uncased WordPiece tokenizer of tiny_vocabulary(), its vocab.txt written into
    `directory` (default: this session's cache) for tests that need the file too."""
    path = (directory or _cache_root / "vocab") / "vocab.txt"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(t + "\n" for t in tiny_vocabulary()))
    return load_tokenizer(path, lowercase=True)


def tiny_model(
    task: str,
    labels: list[str] | None,
    seed: int,
    max_seq_length: int,
    problem_type: str | None = None,
    pooling: str = "mean",
    normalize: bool = True,
    vocab_size: int | None = None,
    initializer_range: float = 0.02,
) -> torch.nn.Module:
    config = BertConfig(
        initializer_range=initializer_range,
        vocab_size=vocab_size or len(tiny_vocabulary()),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=max_seq_length,
        id2label=dict(enumerate(labels)) if labels else None,
        problem_type=HF_PROBLEM_TYPES[problem_type] if problem_type else None,
    )
    with torch.random.fork_rng():  # leave the caller's random stream alone
        torch.manual_seed(seed)
        if task == "embedding":
            return HEADS[task](config, pooling=pooling, normalize=normalize).eval()
        return HEADS[task](config).eval()


def build_tiny_package(
    out_dir: Path,
    task: str,
    *,
    labels: list[str] | None = None,
    seed: int = 0,
    max_seq_length: int = 128,
    variants: tuple[str, ...] = ("fp32",),
    tokenizer: Tokenizer | None = None,
    problem_type: str | None = None,
    pooling: str = "mean",
    normalize: bool = True,
    name: str | None = None,
    checkpoint_dir: Path | None = None,
    hidden_states: bool = False,
    initializer_range: float = 0.02,
) -> ModelPackage:
    """Export a tiny random model of `task` into `out_dir` and return the package read back.
    problem_type uses the package's names (single_label, multi_label, regression);
    hidden_states: every layer's pooled states too (embedding); initializer_range: the
    weights' spread (STANDIN_RANGE for answers that differ by input)."""
    out_dir = Path(out_dir)
    if labels is None and task in DEFAULT_LABELS:
        labels = ["score"] if problem_type == "regression" else DEFAULT_LABELS[task]
    tok = tokenizer or tiny_tokenizer()
    spec = (task, labels, seed, max_seq_length, problem_type, pooling, normalize)

    def model() -> torch.nn.Module:
        return tiny_model(
            *spec, vocab_size=tok.get_vocab_size(), initializer_range=initializer_range
        )

    name = name or out_dir.name
    key = repr(
        (
            spec,
            tuple(variants),
            name,
            tokenizer.to_str() if tokenizer else None,
            hidden_states,
            initializer_range,
        )  # fmt: skip
    )
    key = hashlib.sha256(key.encode()).hexdigest()[:16]
    if key not in _cache:
        export_package(model(), task, _cache_root / key, tokenizer=tok, name=name,
                       max_seq_length=max_seq_length, variants=variants, verbose=False,
                       hidden_states=hidden_states)  # fmt: skip
        _cache[key] = _cache_root / key
    if checkpoint_dir is not None:
        from training.checkpoint import save_model

        save_model(model(), checkpoint_dir, tokenizer=tok)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    shutil.copytree(_cache[key], out_dir)
    return read_package(out_dir)
