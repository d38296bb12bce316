"""Fine-tuning: the recipe's pieces, a tiny end-to-end run per task on real examples (the loss
falls, metrics are computed, the best checkpoint reloads and exports), resume, bad input."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch

from heads.package import read_package
from tests.training.tiny import tiny_bert_config
from training import evaluate
from training import finetune as ft
from training.checkpoint import load_model, load_state_dict_file, save_model
from training.cli import as_args
from training.config import BertConfig
from training.data.epochs import DistributedSampler, epoch_batches
from training.data.records import DataError
from training.export import export_package
from training.finetune import FinetuneArgs, finetune, parse_args
from training.model import BertForEmbedding
from training.optim import adamw
from training.plots import read_log
from training.tokenizer import load_tokenizer

# --- the recipe -------------------------------------------------------------------------


def test_no_weight_decay_on_biases_and_layernorm(init):
    model = load_model(init, task="classification", labels=["0", "1"])
    decay, no_decay = adamw(model, 1e-4, 0.01).param_groups
    names = {id(p): n for n, p in model.named_parameters()}
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    assert all(
        names[id(p)].endswith("weight") and "LayerNorm" not in names[id(p)] for p in decay["params"]
    )
    assert {names[id(p)].rsplit(".", 1)[-1] for p in no_decay["params"]} == {"bias", "weight"}
    assert all(
        "LayerNorm" in names[id(p)] for p in no_decay["params"] if names[id(p)].endswith("weight")
    )


def test_adamw_is_fused_on_cpu_and_steps_as_the_per_tensor_loop(init):
    """One kernel for every tensor on CPU too (issue 34: 103 tensors one at a time were 7 ops
    each, the largest difference from transformers' Trainer); the same update within fp32
    rounding."""
    models = [load_model(init, task="classification", labels=["0", "1"]).eval() for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())  # the same new head, no dropout
    fused, loop = adamw(models[0], 1e-3, 0.01), adamw(models[1], 1e-3, 0.01, fused=False)
    assert fused.defaults["fused"] and not loop.defaults["fused"]
    torch.manual_seed(0)
    ids = torch.randint(5, 20, (4, 6))
    for _ in range(3):
        for model, optimizer in zip(models, (fused, loop), strict=True):
            model(ids, labels=torch.tensor([0, 1, 0, 1])).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    for a, b in zip(models[0].parameters(), models[1].parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_help_explains_every_option(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    text = capsys.readouterr().out
    for option in (
        "--epochs",
        "--lr",
        "--batch-size",
        "--max-seq-length",
        "--doc-stride",
        "--warmup-ratio",
        "--weight-decay",
        "--seed",
        "--max-steps",
        "--eval-every",
        "--precision",
        "--export",
        "--resume",
    ):
        assert option in text
    assert "run_classifier.py" in text and "(default 5e-05)" in text


def test_the_python_api_takes_a_namespace_or_a_dict(tmp_path):
    values = {"task": "classification", "init": "i", "train": "t", "out": "o", "lr": 1e-4}
    args = as_args(FinetuneArgs, values)
    assert args == FinetuneArgs(task="classification", init="i", train="t", out="o", lr=1e-4)
    assert as_args(FinetuneArgs, ft.argparse.Namespace(**values)) == args
    with pytest.raises(TypeError, match="unknown arguments: learning_rate"):
        as_args(FinetuneArgs, {"learning_rate": 1})


# --- end to end on real data ------------------------------------------------------------

TASKS = {
    # task: (train file, eval file, main metric, overrides). A tiny random encoder needs ~25
    # steps before it starts to memorise SST-2 sentences; the other heads learn from step one.
    "classification": ("sst2/dev.tsv", "sst2/dev.tsv", "accuracy", {"max_train_examples": 64}),
    "token-classification": ("conll2003/eng.testa", "conll2003/eng.testb", "f1", {}),
    "question-answering": (
        "squad/dev-v1.1.json",
        "squad/dev-v1.1.json",
        "f1",
        {"max_train_examples": 16, "max_seq_length": 96, "doc_stride": 32},
    ),
    "embedding": ("stsb/train.tsv", "stsb/dev.tsv", "spearman", {}),
}
CONLL_TAGS = ["O", "B-LOC", "I-LOC", "B-MISC", "I-MISC", "B-ORG", "I-ORG", "B-PER", "I-PER"]


@pytest.fixture(scope="module")
def bert_vocab_init(shared_data, tmp_path_factory):
    """A tiny encoder with bert-base-uncased's vocabulary, for the real data."""
    tok = load_tokenizer(shared_data / "vocab" / "bert-base-uncased" / "vocab.txt")
    torch.manual_seed(0)
    model = BertForEmbedding(tiny_bert_config(tok.get_vocab_size(with_added_tokens=True)))
    return save_model(model, tmp_path_factory.mktemp("bert-vocab") / "init", tok)


@pytest.mark.shared
@pytest.mark.parametrize("task", TASKS)
def test_tiny_end_to_end_run(task, shared_data, bert_vocab_init, tmp_path):
    train, dev, metric, overrides = TASKS[task]
    args = FinetuneArgs(
        task=task,
        init=str(bert_vocab_init),
        train=str(shared_data / train),
        eval=str(shared_data / dev),
        out=str(tmp_path / "run"),
        max_train_examples=32,
        max_eval_examples=16,
        batch_size=8,
        epochs=4,
        lr=5e-3,
        warmup_ratio=0.0,
        log_every=1,
        max_seq_length=64,
        export=True,
    )
    result = finetune(ft.dataclasses.replace(args, **overrides))

    losses = [r["loss"] for r in read_log(result.out / "log.jsonl") if r["split"] == "train"]
    assert sum(losses[-3:]) < sum(losses[:3])  # it learns (the 32 examples, at least)
    summary = json.loads((result.out / "metrics.json").read_text())
    assert summary["main_metric"] == metric and 0 <= summary["best"]["metrics"][metric] <= 100
    assert (result.out / "curves.png").stat().st_size > 0

    model = load_model(result.best_dir, task=task)
    labels = {"classification": ["0", "1"], "token-classification": CONLL_TAGS}.get(task)
    assert BertConfig.load(result.best_dir).labels == labels  # id2label in config.json
    assert labels is None or model.num_labels == len(labels)
    package = read_package(result.package_dir)
    assert package.task == task
    assert 0 <= max(package.parity["fp32"]["max_abs_diff"].values()) <= 1e-4

    # The exported package, run by ONNX Runtime through the service's task code, scores what
    # the checkpoint scored.
    scored = tmp_path / "package.json"
    evaluate_args = ["--eval", args.eval, "--limit", "16", "--output", str(scored)]
    if task == "question-answering":
        evaluate_args += ["--doc-stride", "32", "--max-seq-length", "96"]
    assert evaluate.main(["--package", str(result.package_dir), *evaluate_args]) == 0
    from_package = json.loads(scored.read_text())[metric]
    assert from_package == pytest.approx(summary["best"]["metrics"][metric], abs=1e-3)


def test_grouping_by_length_keeps_every_row_once_and_pads_less():
    rng = torch.Generator().manual_seed(0)
    lengths = torch.randint(5, 400, (1000,), generator=rng).tolist()
    rows = list(range(len(lengths)))
    sampler = DistributedSampler(rows, num_replicas=1, rank=0, shuffle=True, seed=7)

    def padded(batches):  # tokens a batch pads to, summed: what compute is spent on
        return sum(len(b) * max(lengths[i] for i in b) for b in batches)

    for epoch in (0, 1):
        plain = epoch_batches(sampler, epoch, 8)
        grouped = epoch_batches(sampler, epoch, 8, lengths)
        assert sorted(i for b in grouped for i in b) == rows  # every row, once
        assert [len(b) for b in grouped] == [len(b) for b in plain]
        assert padded(grouped) < 0.7 * padded(plain)
        assert grouped == epoch_batches(sampler, epoch, 8, lengths)  # what --resume needs
        # still shuffled: the longest batch is not always first, nor lengths in order
        means = [sum(lengths[i] for i in b) / len(b) for b in grouped]
        assert means != sorted(means) and means != sorted(means, reverse=True)
    assert epoch_batches(sampler, 0, 8, lengths) != epoch_batches(sampler, 1, 8, lengths)


# --- resume and bad input (tiny vocabulary, no ../shared) -------------------------------


@pytest.mark.parametrize("group", [False, True], ids=["shuffled", "grouped-by-length"])
def test_resume_after_interruption_repeats_the_uninterrupted_run(init, sentiment, tmp_path, group):
    args = FinetuneArgs(
        group_by_length=group,
        task="classification",
        init=str(init),
        train=str(sentiment),
        eval=str(sentiment),
        out=str(tmp_path / "straight"),
        batch_size=4,
        epochs=2,
        lr=1e-3,
        save_every=3,
        log_every=1,
    )
    finetune(args)

    calls = {"n": 0}

    def interrupted(*a):
        calls["n"] += 1
        # 4 steps per epoch; saves at steps 3, 4 (epoch end), 6: a crash in step 8 of 8
        if calls["n"] == 8:
            raise KeyboardInterrupt
        return ft.compute_loss(*a)

    again = ft.dataclasses.replace(args, out=str(tmp_path / "resumed"))
    with pytest.raises(KeyboardInterrupt):
        finetune(again, loss_fn=interrupted)
    assert (
        torch.load(tmp_path / "resumed" / "last" / "trainer_state.pt", weights_only=False)["step"]
        == 6
    )
    finetune(ft.dataclasses.replace(again, resume=True))

    straight = load_state_dict_file(tmp_path / "straight" / "last")
    resumed = load_state_dict_file(tmp_path / "resumed" / "last")
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)
    logs = [
        [
            (r["step"], r["loss"])
            for r in read_log(tmp_path / d / "log.jsonl")
            if r["split"] == "train"
        ]
        for d in ("straight", "resumed")
    ]
    assert logs[0] == logs[1]  # same batches, same dropout, same optimizer state


def test_label_names_are_saved_and_exported_with_the_window(init, sentiment, tmp_path):
    """--labels names the data's ids in order; best/ carries names and window, so a later
    standalone export makes the package `--export` made."""
    args = FinetuneArgs(
        task="classification", init=str(init), train=str(sentiment), eval=str(sentiment),
        out=str(tmp_path / "run"), labels="negative,positive", max_seq_length=24, batch_size=8,
        epochs=1, export=True,
    )  # fmt: skip
    result = finetune(args)
    assert BertConfig.load(result.best_dir).labels == ["negative", "positive"]
    assert result.best["metrics"]["accuracy"] >= 0  # evaluated against the 0/1 gold labels
    made = read_package(result.package_dir)
    later = export_package(result.best_dir, "classification", tmp_path / "later", verbose=False)
    assert made.labels == later.labels == ["negative", "positive"]
    assert made.max_seq_length == later.max_seq_length == 24
    with pytest.raises(ValueError, match="--labels names 3 labels but .* has 2: 0, 1"):
        finetune(ft.dataclasses.replace(args, labels="neg,neu,pos", out=str(tmp_path / "o")))


def test_labels_in_the_data_get_the_ids_labels_gives_them(init, tmp_path):
    """Data labelled with names: --labels orders them (the ids once came from the sorted names
    and --labels renamed them: "good,bad" made every good example bad's id)."""
    from training.data.tasks import training_rows
    from training.tokenizer import load_tokenizer

    train = tmp_path / "train.jsonl"
    rows = [{"text": "fine film", "label": "good"}, {"text": "dull film", "label": "bad"}]
    train.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = FinetuneArgs(task="classification", init=str(init), train=str(train), out="o",
                        labels="good,bad")  # fmt: skip
    known = ft.known_labels(args, init)
    encoded, labels, _ = training_rows(
        "classification", train, load_tokenizer(init), 16, known=known
    )
    assert labels == ft.label_names(args, labels) == ["good", "bad"]
    assert [r["labels"] for r in encoded] == [0, 1]  # good is id 0, as --labels says
    # a name --labels lacks: the data's own ids, and the count check says what is wrong
    args = ft.dataclasses.replace(args, labels="good,poor")
    _, labels, _ = training_rows("classification", train, load_tokenizer(init), 16,
                                 known=ft.known_labels(args, init))  # fmt: skip
    assert labels == ["bad", "good"]


def test_an_eval_label_unseen_in_training_is_an_error_that_names_it(init, sentiment, tmp_path):
    dev = tmp_path / "dev.tsv"
    dev.write_text("sentence\tlabel\ngood film\t1\nso so\t2\n")
    args = FinetuneArgs(
        task="classification",
        init=str(init),
        train=str(sentiment),
        eval=str(dev),
        out=str(tmp_path / "o"),
    )
    with pytest.raises(DataError, match=rf"{dev}:3: label '2' was not seen in the training data"):
        finetune(args)


def test_the_command_line_reports_bad_input_without_a_traceback(init, sentiment, tmp_path, capsys):
    code = ft.main(
        [
            "--task",
            "question-answering",
            "--init",
            str(init),
            "--train",
            str(sentiment),
            "--out",
            str(tmp_path / "o"),
        ]
    )
    assert code == 2
    assert "error:" in capsys.readouterr().err


# ~12 s: CI's slow stage runs DDP (torchrun, gloo) for real
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_ddp_with_two_gloo_processes_on_cpu(init, sentiment, tmp_path):
    out = tmp_path / "ddp"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "-m",
        "training.finetune",
        "--task",
        "classification",
        "--init",
        str(init),
        "--train",
        str(sentiment),
        "--eval",
        str(sentiment),
        "--out",
        str(out),
        "--batch-size",
        "8",
        "--epochs",
        "2",
        "--lr",
        "1e-3",
        "--log-every",
        "1",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "metrics.json").read_text())
    assert summary["steps"] == 4  # 16 examples, 8 per step over both processes, 2 epochs
    assert summary["hardware"].startswith("2 process")
    assert load_model(out / "best", task="classification").num_labels == 2


def test_the_log_survives_a_half_written_line_and_plots(tmp_path):
    from training.plots import plot_curves, write_log_row

    log = tmp_path / "log.jsonl"
    for step in (1, 2, 3):
        write_log_row(log, {"split": "train", "step": step, "loss": 1.0 / step, "lr": 1e-4 * step})
    write_log_row(log, {"split": "eval", "step": 3, "accuracy": torch.tensor(81.5), "loss": 0.4})
    with log.open("a") as f:
        f.write('{"split": "train", "step": 4, "lo')  # killed mid-write
    assert [r["step"] for r in read_log(log)] == [1, 2, 3, 3]
    assert read_log(log)[-1]["accuracy"] == 81.5
    assert plot_curves(log, tmp_path / "curves.png").stat().st_size > 0


# --- mixed precision ----------------------------------------------------------------------


def _mixed_precision_run(init, sentiment, out, precision: str):
    args = FinetuneArgs(
        task="classification",
        init=str(init),
        train=str(sentiment),
        eval=str(sentiment),
        out=str(out),
        batch_size=8,
        epochs=3,
        lr=1e-3,
        log_every=1,
        precision=precision,
    )
    result = finetune(args)
    losses = [r["loss"] for r in read_log(result.out / "log.jsonl") if r["split"] == "train"]
    assert all(math.isfinite(loss) for loss in losses)
    assert losses[-1] < losses[0]
    # the checkpoint is saved in fp32 whatever the autocast dtype
    model = load_model(result.best_dir, task="classification")
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    return result


def test_grouping_is_refused_for_embeddings_whose_batch_holds_the_negatives(init, tmp_path):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text('{"anchor": "a cat", "positive": "a kitten"}\n' * 4)
    args = FinetuneArgs(task="embedding", init=str(init), train=str(pairs), out=str(tmp_path / "o"))
    with pytest.raises(ValueError, match="--group-by-length is not for embedding"):
        finetune(ft.dataclasses.replace(args, group_by_length=True))


def test_bf16_autocast_trains_on_cpu(init, sentiment, tmp_path):
    _mixed_precision_run(init, sentiment, tmp_path / "bf16", "bf16")


def test_fp16_is_refused_without_a_gpu(init, sentiment, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: fp16 is allowed")
    with pytest.raises(ValueError, match="fp16 needs a CUDA device"):
        _mixed_precision_run(init, sentiment, tmp_path / "fp16", "fp16")


@pytest.mark.gpu
def test_fp16_with_loss_scaling_trains_on_a_gpu(init, sentiment, tmp_path):
    _mixed_precision_run(init, sentiment, tmp_path / "fp16", "fp16")
