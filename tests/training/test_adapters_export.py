"""training.adapters: the encoder package (one graph with per-row LoRA inputs) and adapter
packages (a LoRA update and a head, or a head on the frozen encoder) that name it by digest.

Asserted: the encoder package reads back as task "encoder" with its parity recorded within
1e-4 and a LoRA slot on exactly the layers --lora-targets names; each adapter package's
served computation (the encoder graph, then heads.adapters' numpy head) equals the model it
stands for, within 1e-4; adapters over the wrong encoder, over a package that is no encoder,
or exported as if they were full models are refused, by the library and by the CLI.

One tiny encoder (hidden 32, 2 layers) drawn wide (benchmarks.tiny.STANDIN_RANGE), so that
six steps of LoRA move its answers by a tenth, far above the 1e-4 being checked; every
package is built once for the module. About 20 s on 2 cores.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import torch
from tokenizers import Tokenizer

from benchmarks.tiny import STANDIN_RANGE
from heads.adapters import (
    ADAPTER_FILE,
    ADAPTER_INPUT,
    ALL_HIDDEN_STATES,
    LAST_HIDDEN_STATE,
    read_adapter,
    stack_lora,
)
from heads.package import ModelPackage, read_package
from heads.rows import encode, pad, row, template
from tests.training.tiny import tiny_bert_config, tiny_tokenizer
from training import finetune as ft
from training.adapters import AdapterExportError, export_adapter, export_encoder
from training.checkpoint import load_model, save_model
from training.export import FP32_TOLERANCE, export_package, main
from training.lora import encoder_digest
from training.model import BertForEmbedding

DATA = Path(__file__).resolve().parents[2] / "examples" / "data"
TEXTS = [
    "a warm , funny film that never drags",
    "the plot falls apart in the second hour",
    "ok",
    "Anna flew from Paris to Lisbon with the Red Cross on Monday morning",
]
LAYERS = 2  # tiny_bert_config's depth
# The training data each adapter task fine-tunes on (examples/data), and its own options.
RUNS = {
    "sst-lora": ("classification", "sentiment/train.tsv", ["--lora-rank", "4"]),
    "sst-merged": ("classification", "sentiment/train.tsv", ["--lora-rank", "4", "--merge"]),
    "ner-frozen": ("token-classification", "ner/train.conll", ["--freeze-encoder"]),
    "ner-all-sum": (
        "token-classification",
        "ner/train.conll",
        ["--freeze-encoder", "--features", "all-sum"],
    ),
    "qa-lora": (
        "question-answering",
        "qa/train.json",
        ["--lora-rank", "4", "--max-seq-length", "64", "--doc-stride", "16"],
    ),
}


def wide_init(directory: Path, tokenizer: Tokenizer, seed: int = 0) -> Path:
    """tests.training.tiny's encoder checkpoint with weights drawn STANDIN_RANGE wide: its
    answers differ by input, and a few LoRA steps change them visibly."""
    torch.manual_seed(seed)
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    config = dataclasses.replace(tiny_bert_config(vocab), initializer_range=STANDIN_RANGE)
    return save_model(BertForEmbedding(config), directory, tokenizer)


@contextmanager
def one_torch_thread() -> Iterator[None]:
    """For the module's fixtures (tests/training/conftest.py's is per test): tiny models gain
    nothing from more threads, and on a busy runner two made each fine-tuning 15x slower."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def finetune(init: Path, task: str, train: str, out: Path, *more: str, seed: int = 42) -> Path:
    """best/ of six fine-tuning steps of `task` on examples/data/`train`."""
    args = ft.parse_args(
        ["--task", task, "--init", str(init), "--train", str(DATA / train), "--out", str(out),
         "--max-steps", "6", "--batch-size", "8", "--lr", "1e-2", "--seed", str(seed), *more]
    )  # fmt: skip
    return ft.finetune(args).best_dir


def served(adapter_dir: Path, base_dir: Path, texts: list[str]) -> list[dict[str, np.ndarray]]:
    """What the service computes for `texts` (one padded batch): the encoder graph with the
    adapter in slot 1 of the stacked LoRA inputs, then its head on each row's real tokens."""
    base, package = read_package(base_dir), read_package(adapter_dir)
    assert base.encoder is not None and package.adapter is not None
    adapter = read_adapter(package.path, package.name, package.adapter)
    tokenizer = Tokenizer.from_file(str(base.tokenizer_path))
    rows = [row(template(tokenizer), encode(tokenizer, t).ids) for t in texts]
    feeds = {
        **pad(rows, base.pad_token_id or 0),
        ADAPTER_INPUT: np.ones(len(rows), dtype=np.int64),
        **stack_lora(base.encoder["lora"], [adapter]),
    }
    session = ort.InferenceSession(
        str(base.variant_path("fp32")), providers=["CPUExecutionProvider"]
    )
    last, states = session.run([LAST_HIDDEN_STATE, ALL_HIDDEN_STATES], feeds)
    return [
        adapter.head({LAST_HIDDEN_STATE: last[k, : len(r)], ALL_HIDDEN_STATES: states[k, : len(r)]})
        for k, r in enumerate(rows)
    ]


@dataclasses.dataclass
class Built:
    """The module's packages; fine-tuning runs and adapter exports are made on first use, so
    that one that fails fails its own tests only."""

    root: Path
    init: Path
    encoder: ModelPackage
    other_encoder: Path  # over another draw of the same shape: other encoder weights
    _best: dict[str, Path] = dataclasses.field(default_factory=dict)
    _adapters: dict[str, ModelPackage] = dataclasses.field(default_factory=dict)

    def best(self, name: str) -> Path:
        """best/ of the RUNS fine-tuning `name`."""
        if name not in self._best:
            task, train, more = RUNS[name]
            self._best[name] = finetune(self.init, task, train, self.root / "runs" / name, *more)
        return self._best[name]

    def adapter(self, name: str) -> ModelPackage:
        """The adapter package of RUNS `name` over `encoder`, at models/`name`."""
        if name not in self._adapters:
            out = self.root / "models" / name
            self._adapters[name] = export_adapter(
                self.best(name), self.encoder.path, out, verbose=False
            )
        return self._adapters[name]

    def full(self) -> Path:
        """The --merge run exported as a full classification package (no encoder)."""
        out = self.root / "full" / "sst"
        if not out.exists():
            export_package(self.best("sst-merged"), "classification", out, verbose=False)
        return out


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    root = tmp_path_factory.mktemp("adapters")
    tokenizer = tiny_tokenizer()
    init = wide_init(root / "init", tokenizer)
    other_init = wide_init(root / "other-init", tokenizer, seed=1)
    with one_torch_thread():
        encoder = export_encoder(init, root / "models" / "enc", verbose=False)
        other = export_encoder(other_init, root / "models" / "other-enc", verbose=False).path
    return Built(root, init, encoder, other)


# --- the encoder package ------------------------------------------------------------------


def test_the_encoder_package_reads_back_with_its_parity(built: Built) -> None:
    package = read_package(built.encoder.path)
    assert package.task == "encoder" and package.labels is None
    assert package.encoder is not None
    assert package.encoder["digest"] == encoder_digest(load_model(built.init, task="embedding"))
    assert (package.encoder["hidden_size"], package.encoder["layers"]) == (32, LAYERS)
    assert [o["name"] for o in package.outputs] == [LAST_HIDDEN_STATE, ALL_HIDDEN_STATES]
    assert package.outputs[1]["shape"] == ["batch", "sequence", LAYERS + 1, 32]
    inputs = [i["name"] for i in package.inputs]
    assert inputs[:4] == ["input_ids", "attention_mask", "token_type_ids", ADAPTER_INPUT]
    assert inputs[4:] == [f"lora_{m}.{k}" for k in range(2 * LAYERS) for m in ("A", "B")]
    diffs = package.parity["fp32"]["max_abs_diff"]
    assert set(diffs) == {LAST_HIDDEN_STATE, ALL_HIDDEN_STATES}
    assert max(diffs.values()) <= FP32_TOLERANCE


def test_query_value_are_the_default_lora_slots(built: Built) -> None:
    assert built.encoder.encoder is not None
    assert built.encoder.encoder["targets"] == ["query", "value"]
    assert built.encoder.encoder["lora"] == [
        {"module": f"encoder.layer.{i}.attention.self.{m}", "in": 32, "out": 32}
        for i in range(LAYERS)
        for m in ("query", "value")
    ]


def test_slot_zero_is_the_plain_encoder(built: Built) -> None:
    """Rows of frozen heads gather slot 0, all zeros: the encoder's own states."""
    base = built.encoder
    assert base.encoder is not None
    tokenizer = Tokenizer.from_file(str(base.tokenizer_path))
    feeds = pad([row(template(tokenizer), encode(tokenizer, t).ids) for t in TEXTS])
    session = ort.InferenceSession(
        str(base.variant_path("fp32")), providers=["CPUExecutionProvider"]
    )
    # slot 0 (zeros) beside a slot 1 of ones that no row gathers
    stacked = {
        k: np.concatenate([v, np.ones_like(v)])
        for k, v in stack_lora(base.encoder["lora"], []).items()
    }
    (last,) = session.run(
        [LAST_HIDDEN_STATE], {**feeds, ADAPTER_INPUT: np.zeros(len(TEXTS), np.int64), **stacked}
    )
    model = load_model(built.init, task="embedding")
    with torch.inference_mode():
        expected = model.bert(*(torch.from_numpy(feeds[n]) for n in feeds)).last_hidden_state
    real = feeds["attention_mask"] == 1
    assert np.abs(last - expected.numpy())[real].max() <= FP32_TOLERANCE


def test_lora_targets_through_the_cli(built: Built, capsys: pytest.CaptureFixture[str]) -> None:
    """--lora-targets intermediate,output: the FFN's two linear maps; "output" is the layer's
    output.dense, not attention.output.dense."""
    out = built.root / "models" / "enc-ffn"
    argv = ["--task", "encoder", "--checkpoint", str(built.init), "--out", str(out)]
    assert main([*argv, "--lora-targets", "intermediate,output"]) == 0, capsys.readouterr().err
    package = read_package(out)
    assert package.encoder is not None
    assert package.encoder["targets"] == ["intermediate", "output"]
    assert package.encoder["lora"] == [
        slot
        for i in range(LAYERS)
        for slot in (
            {"module": f"encoder.layer.{i}.intermediate.dense", "in": 32, "out": 37},
            {"module": f"encoder.layer.{i}.output.dense", "in": 37, "out": 32},
        )
    ]
    assert max(package.parity["fp32"]["max_abs_diff"].values()) <= FP32_TOLERANCE


def test_an_unknown_lora_target_is_refused(
    built: Built, capsys: pytest.CaptureFixture[str]
) -> None:
    out = built.root / "models" / "enc-bad"
    argv = ["--task", "encoder", "--checkpoint", str(built.init), "--out", str(out)]
    assert main([*argv, "--lora-targets", "query,ffn"]) == 1
    err = capsys.readouterr().err
    assert "unknown --lora-targets ffn" in err and "attention-output" in err
    assert not out.exists()


# --- adapter packages ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "task", "kind", "head"),
    [
        ("sst-lora", "classification", "lora", {"kind": "pooler"}),
        ("ner-frozen", "token-classification", "frozen", {"kind": "tokens", "layers": [-1]}),
        (
            "ner-all-sum",
            "token-classification",
            "frozen",
            {"kind": "tokens", "layers": [1, -1], "combine": "sum"},
        ),
        ("qa-lora", "question-answering", "lora", {"kind": "span"}),
    ],
)
def test_an_adapter_package_names_its_encoder_and_keeps_parity(
    built: Built, name: str, task: str, kind: str, head: dict[str, Any]
) -> None:
    package = read_package(built.adapter(name).path)
    assert package.task == task and package.variants == {}
    block = package.adapter
    assert block is not None and block["kind"] == kind
    assert {k: block["head"][k] for k in head} == head
    assert built.encoder.encoder is not None
    assert block["base"]["name"] == "enc"
    assert block["base"]["digest"] == built.encoder.encoder["digest"]
    assert max(package.parity["served"]["max_abs_diff"].values()) <= FP32_TOLERANCE
    with np.load(package.path / ADAPTER_FILE) as npz:
        lora = sorted(k for k in npz.files if k.startswith("lora."))
    if kind == "lora":
        assert block["rank"] == 4 and block["targets"] == ["query", "value"]
        assert lora == sorted(
            f"lora.encoder.layer.{i}.attention.self.{m}.{ab}"
            for i in range(LAYERS)
            for m in ("query", "value")
            for ab in "AB"
        )
    else:
        assert block["rank"] == 0 and lora == []


def test_a_head_on_several_layers_reads_the_hidden_states(built: Built) -> None:
    package = built.adapter("ner-all-sum")
    assert package.adapter is not None
    adapter = read_adapter(package.path, package.name, package.adapter)
    assert adapter.head.wants == {ALL_HIDDEN_STATES}
    assert adapter.head.layer_weights is not None and adapter.head.layer_weights.shape == (2,)
    last = built.adapter("ner-frozen")
    assert last.adapter is not None
    assert read_adapter(last.path, last.name, last.adapter).head.wants == frozenset()


def test_the_lora_adapter_answers_as_the_merged_fine_tuning(built: Built) -> None:
    """Independently of the export's own check: the same run with --merge, in PyTorch."""
    got = served(built.adapter("sst-lora").path, built.encoder.path, TEXTS)
    merged = load_model(built.best("sst-merged"), task="classification")
    base = load_model(built.init, task="embedding")
    tokenizer = Tokenizer.from_file(str(built.encoder.tokenizer_path))
    for text, answer in zip(TEXTS, got, strict=True):
        feeds = pad([row(template(tokenizer), encode(tokenizer, text).ids)])
        args = [torch.from_numpy(feeds[n]) for n in feeds]
        with torch.inference_mode():
            expected = merged(*args).logits[0].numpy()
            # the LoRA matters: the encoder without it answers otherwise
            plain = merged.classifier(merged.bert.pooler(base.bert(*args).last_hidden_state))
        assert np.abs(answer["logits"] - expected).max() <= FP32_TOLERANCE
        assert np.abs(plain[0].numpy() - expected).max() > 100 * FP32_TOLERANCE


# --- refused ------------------------------------------------------------------------------


def test_an_adapter_over_another_encoder_is_refused(built: Built) -> None:
    theirs = read_package(built.other_encoder)
    assert theirs.encoder is not None and built.encoder.encoder is not None
    out = built.root / "models" / "wrong-base"
    with pytest.raises(AdapterExportError, match="a different base") as e:
        export_adapter(built.best("sst-lora"), built.other_encoder, out, verbose=False)
    assert built.encoder.encoder["digest"][:12] in str(e.value)
    assert theirs.encoder["digest"][:12] in str(e.value)
    assert not out.exists()


def test_a_base_package_that_is_no_encoder_is_refused(built: Built) -> None:
    with pytest.raises(AdapterExportError, match="is a classification package; --base-package"):
        export_adapter(built.best("sst-lora"), built.full(), built.root / "x", verbose=False)


def test_cli_exports_an_adapter_over_its_base_package(
    built: Built, capsys: pytest.CaptureFixture[str]
) -> None:
    out = built.root / "models" / "sst-cli"
    argv = ["--checkpoint", str(built.best("sst-lora")), "--out", str(out)]
    assert main([*argv, "--base-package", str(built.encoder.path)]) == 0, capsys.readouterr().err
    package = read_package(out)
    assert package.task == "classification" and package.name == "sst-cli"
    with (
        np.load(out / ADAPTER_FILE) as a,
        np.load(built.adapter("sst-lora").path / ADAPTER_FILE) as b,
    ):
        assert sorted(a.files) == sorted(b.files)
        assert all(np.array_equal(a[k], b[k]) for k in a.files)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--checkpoint", "{sst-lora}", "--task", "classification"],
            "holds an adapter and no full weights: export it with --base-package",
        ),
        (
            ["--checkpoint", "{sst-lora}", "--base-package", "{other-enc}"],
            "a different base",
        ),
        (
            ["--checkpoint", "{sst-lora}", "--base-package", "{full}"],
            "--base-package takes an encoder package",
        ),
    ],
    ids=["without-base-package", "wrong-base", "base-not-an-encoder"],
)
def test_cli_refusals_are_one_line_and_exit_1(
    built: Built, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    paths = {
        "{sst-lora}": str(built.best("sst-lora")),
        "{other-enc}": str(built.other_encoder),
        "{full}": str(built.full()),
    }
    out = built.root / "refused"
    capsys.readouterr()  # what building the paths printed
    assert main([*(paths.get(a, a) for a in argv), "--out", str(out)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message in err and "\n" not in err
    assert not out.exists()
