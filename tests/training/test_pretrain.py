"""`python -m training.pretrain` end to end on a tiny model and a synthetic corpus: the loss
falls, the checkpoint opens in transformers with the same outputs, a stopped run resumes onto
the same loss curve, and bad input fails with a message naming the file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.training.corpus_text import write_chain_corpus, write_corpus
from training.checkpoint import load_model, save_model
from training.cli import duration
from training.config import BertConfig
from training.model import BertForPreTraining, set_dropout
from training.plots import read_log
from training.pretrain import (
    build_parser,
    check_args,
    flops_per_token,
    main,
    parse_args,
    pretrain,
)
from training.tokenizer import load_tokenizer, save_tokenizer, train_tokenizer

REPO = Path(__file__).resolve().parents[2]
# Hidden 64, 2 layers: a few milliseconds a step on a busy CPU.
TINY = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 128,
    "max_position_embeddings": 64,
}


@pytest.fixture(autouse=True)
def one_thread():
    # A tiny model on a shared CPU: a second intra-op thread only adds contention (10x slower
    # under load), so these tests use one, as OMP_NUM_THREADS=1 would.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("pretrain")
    (root / "config.json").write_text(json.dumps(TINY))
    train = write_corpus(root / "train.txt", documents=600, seed=0)
    # Trained once and shared: WordPiece training is not deterministic from run to run.
    save_tokenizer(train_tokenizer([train], vocab_size=200), root / "tokenizer")
    return {
        "train": train,
        "eval": write_corpus(root / "eval.txt", documents=60, seed=1),
        "config": root / "config.json",
        "tokenizer": root / "tokenizer" / "tokenizer.json",
        "cache": root / "cache",
    }


def args_for(data: dict[str, Path], out: Path, *extra: str):
    argv = (
        f"--corpus {data['train']} --tokenizer {data['tokenizer']} --config {data['config']} "
        f"--max-seq-length 32 --batch-size 8 --cache-dir {data['cache']} --out {out} --no-progress"
    ).split()
    return parse_args([*argv, *extra])


def train_rows(out: Path) -> list[dict]:
    return [r for r in read_log(out / "log.jsonl") if r["split"] == "train"]


def test_a_tiny_run_learns_and_its_checkpoint_opens_in_transformers(data, tmp_path):
    transformers = pytest.importorskip("transformers")
    out = tmp_path / "run"
    extra = "--steps 200 --lr 2e-3 --warmup 10 --eval-every 200 --eval-batches 8 --log-every 20"
    result = pretrain(args_for(data, out, *extra.split(), "--eval-corpus", str(data["eval"])))
    evals = [r for r in read_log(out / "log.jsonl") if r["split"] == "eval"]
    assert [r["step"] for r in evals] == [0, 200]
    before, after = evals[0], evals[-1]
    assert after["mlm_loss"] < before["mlm_loss"] - 0.8  # 5.28 (ln 200) -> 4.07 measured
    assert after["mlm_accuracy"] > before["mlm_accuracy"] + 0.1
    assert {"nsp_accuracy", "mlm_accuracy"} <= set(result["eval"])
    rows = train_rows(out)
    assert rows[-1]["mlm_loss"] < rows[0]["mlm_loss"] - 0.5
    assert rows[-1]["seq_per_s"] > 0 and rows[-1]["tokens_per_s"] > 0
    assert (out / "loss.png").stat().st_size > 0

    theirs, info = transformers.BertForPreTraining.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    ours = load_model(out, task="pretraining")
    g = torch.Generator().manual_seed(0)
    input_ids = torch.randint(5, 200, (2, 20), generator=g)
    token_type_ids = (torch.arange(20) >= 11).long().expand(2, 20)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 15:] = 0
    with torch.no_grad():
        a = ours(input_ids, attention_mask, token_type_ids)
        b = theirs.eval()(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
        )
    torch.testing.assert_close(a.prediction_logits, b.prediction_logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(
        a.seq_relationship_logits, b.seq_relationship_logits, atol=1e-5, rtol=0
    )


@pytest.mark.slow  # ~25 s of pretraining
def test_the_model_learns_from_context_not_just_word_frequencies(data, tmp_path):
    # The loss can fall by learning word frequencies alone (the plateau a short run on real
    # text sits near), and a masking or label-alignment fault would stop it there. On a corpus
    # where each word names its neighbours, only context gets far past the most frequent
    # token's share: 74% held-out accuracy measured at 600 steps, against 12% for ".".
    train = write_chain_corpus(tmp_path / "train.txt", documents=800, seed=0)
    held_out = write_chain_corpus(tmp_path / "eval.txt", documents=80, seed=1)
    save_tokenizer(train_tokenizer([train], vocab_size=100), tmp_path / "tokenizer")
    tokenizer = tmp_path / "tokenizer" / "tokenizer.json"
    out = tmp_path / "run"
    argv = (
        f"--corpus {train} --eval-corpus {held_out} --tokenizer {tokenizer} "
        f"--config {data['config']} --max-seq-length 32 --batch-size 16 --steps 600 --lr 3e-3 "
        f"--warmup 20 --eval-every 600 --eval-batches 8 --cache-dir {data['cache']} --out {out} "
        "--no-progress"
    )
    pretrain(parse_args(argv.split()))
    accuracy = [r for r in read_log(out / "log.jsonl") if r["split"] == "eval"][-1]["mlm_accuracy"]

    ids = load_tokenizer(tokenizer).encode(held_out.read_text()).ids
    most_frequent_share = max(ids.count(i) for i in set(ids)) / len(ids)
    assert most_frequent_share < 0.2
    assert accuracy > 0.5 > 2 * most_frequent_share, (accuracy, most_frequent_share)


def test_stopping_and_resuming_gives_the_same_loss_curve(data, tmp_path):
    common = ("--steps", "16", "--lr", "2e-3", "--warmup", "4", "--log-every", "1")
    pretrain(args_for(data, tmp_path / "straight", *common))
    pretrain(args_for(data, tmp_path / "split", *common, "--stop-at", "7"))
    assert [r["step"] for r in train_rows(tmp_path / "split")] == list(range(1, 8))
    pretrain(args_for(data, tmp_path / "split", *common, "--resume"))

    keys = ("step", "loss", "mlm_loss", "nsp_loss", "lr", "grad_norm")
    straight = [[r[k] for k in keys] for r in train_rows(tmp_path / "straight")]
    split = [[r[k] for k in keys] for r in train_rows(tmp_path / "split")]
    assert len(straight) == 16 and split == straight  # exactly, float for float
    a = load_model(tmp_path / "straight", "pretraining").state_dict()
    b = load_model(tmp_path / "split", "pretraining").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_init_continues_from_a_checkpoint_with_its_config_and_vocabulary(data, tmp_path):
    common = ("--lr", "2e-3", "--warmup", "4", "--log-every", "1")
    pretrain(args_for(data, tmp_path / "first", "--steps", "100", *common))
    # An encoder without heads (as a sentence-embedding checkpoint is): the MLM head is new.
    encoder = tmp_path / "encoder"
    save_model(
        load_model(tmp_path / "first", "embedding"), encoder, load_tokenizer(data["tokenizer"])
    )
    for init, out in ((tmp_path / "first", "again"), (encoder, "from-encoder")):
        argv = (
            f"--corpus {data['train']} --init {init} --objective mlm --steps 4 --max-seq-length 32"
        )
        argv += f" --batch-size 8 --cache-dir {data['cache']} --out {tmp_path / out} --no-progress"
        pretrain(parse_args([*argv.split(), *common]))
    first = train_rows(tmp_path / "first")
    again = train_rows(tmp_path / "again")
    # The whole model carried over: the continued run starts where the first one ended
    assert again[0]["mlm_loss"] < first[0]["mlm_loss"] - 0.5
    assert abs(again[0]["mlm_loss"] - first[-1]["mlm_loss"]) < 0.5
    # and an encoder's weights, under a head drawn anew, are the checkpoint's (4 steps apart)
    key = "bert.embeddings.word_embeddings.weight"
    start = load_model(encoder, "pretraining").state_dict()[key]
    moved = (load_model(tmp_path / "from-encoder", "pretraining").state_dict()[key] - start).abs()
    drawn = BertForPreTraining(BertConfig.load(encoder / "config.json")).state_dict()[key]
    drawn = (drawn - start).abs()
    assert moved.mean() < drawn.mean() / 10
    # a run from --init resumes as any other, its tokenizer the one it saved
    argv = f"--corpus {data['train']} --init {tmp_path / 'first'} --objective mlm --steps 6"
    argv += f" --max-seq-length 32 --batch-size 8 --cache-dir {data['cache']} --no-progress"
    pretrain(parse_args([*argv.split(), "--out", str(tmp_path / "again"), "--resume", *common]))
    assert [r["step"] for r in train_rows(tmp_path / "again")] == [1, 2, 3, 4, 5, 6]
    with pytest.raises(SystemExit, match="leave out --config"):
        check_args(
            parse_args([*f"--corpus x --init {init} --config tiny --steps 1 --out o".split()])
        )


@pytest.mark.parametrize("objective, second_loss", [("mlm+sop", "sop_loss"), ("mlm", None)])
def test_the_other_objectives_train(data, tmp_path, objective, second_loss):
    out = tmp_path / objective
    extra = f"--objective {objective} --steps 3 --eval-batches 2 --whole-word-masking"
    result = pretrain(args_for(data, out, *extra.split(), "--eval-corpus", str(data["eval"])))
    row = result["train"]
    assert ("nsp_loss" not in row) and (second_loss is None or second_loss in row)
    assert ("sop_accuracy" in result["eval"]) == (objective == "mlm+sop")
    # MLM alone trains no second-segment head: it stays as initialised (seed 0); SOP's moves.
    torch.manual_seed(0)
    initial = BertForPreTraining(BertConfig.load(out)).state_dict()
    trained = load_model(out, "pretraining").state_dict()
    moved = {k for k in trained if not torch.equal(trained[k], initial[k])}
    assert "cls.predictions.transform.dense.weight" in moved
    assert ("cls.seq_relationship.weight" in moved) == (objective == "mlm+sop")


@pytest.mark.slow  # the unit suite stays under 10 minutes; CI's slow stage runs it
def test_bf16_autocast_on_the_cpu_trains_and_saves_fp32_weights(data, tmp_path, capsys):
    out = tmp_path / "bf16"
    extra = "--steps 60 --lr 2e-3 --warmup 5 --log-every 10 --precision bf16"
    pretrain(args_for(data, out, *extra.split()))
    shown = capsys.readouterr()
    assert "bf16 autocast" in shown.out + shown.err
    rows = train_rows(out)
    assert all(torch.isfinite(torch.tensor(r["mlm_loss"])) for r in rows)
    assert rows[-1]["mlm_loss"] < rows[0]["mlm_loss"] - 0.2
    weights = load_model(out, "pretraining").state_dict()
    assert {t.dtype for t in weights.values() if t.is_floating_point()} == {torch.float32}


def test_albert_options_pretrain_with_sop_and_open_in_transformers(data, tmp_path):
    """ALBERT's recipe: factorised embeddings, shared layers, sentence-order prediction."""
    transformers = pytest.importorskip("transformers")
    config = tmp_path / "albert.json"
    config.write_text(json.dumps({**TINY, "embedding_size": 16, "model_type": "albert"}))
    out = tmp_path / "albert"
    argv = ["--config", str(config), "--objective", "mlm+sop", "--steps", "3"]
    result = pretrain(args_for(data, out, *argv))
    assert "sop_loss" in result["train"]
    ours = load_model(out, "pretraining").eval()
    assert len(ours.bert.encoder.layer) == 1  # AlbertConfig's default: one shared group
    theirs = transformers.AlbertForPreTraining.from_pretrained(out).eval()
    ids = torch.randint(5, ours.config.vocab_size, (2, 12))
    with torch.no_grad():
        a, b = ours(ids), theirs(ids)
    torch.testing.assert_close(a.prediction_logits, b.prediction_logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(a.seq_relationship_logits, b.sop_logits, atol=1e-5, rtol=0)
    E, H = 16, TINY["hidden_size"]
    albert = BertConfig.load(out)
    bert = albert.replace(embedding_size=None, share_layers=False)
    head = 6 * 0.15 * (H * E + albert.vocab_size * E - H * H - albert.vocab_size * H)
    extra = flops_per_token(albert, 32, 0.15) - flops_per_token(bert, 32, 0.15)
    assert extra == pytest.approx(6 * E * H + head)


def test_the_roberta_recipe_is_one_flag(data, tmp_path):
    """Liu et al. 2019: MLM only, 8x the batch through accumulation at lr 7e-4, beta2 0.98;
    an explicit flag still wins over the recipe."""
    base = f"--corpus {data['train']} --tokenizer {data['tokenizer']} --out {tmp_path / 'r'}"
    args = parse_args([*base.split(), "--steps", "1", "--recipe", "roberta"])
    assert (args.objective, args.grad_accum, args.lr, args.adam_beta2) == ("mlm", 8, 7e-4, 0.98)
    assert parse_args([*base.split(), "--steps", "1"]).objective == "mlm+nsp"  # BERT's
    mine = parse_args([*base.split(), "--recipe", "roberta", "--steps", "1", "--lr", "1e-3"])
    assert mine.lr == 1e-3 and mine.objective == "mlm"
    albert = parse_args([*base.split(), "--recipe", "albert", "--steps", "1"])
    assert (albert.objective, albert.config) == ("mlm+sop", "albert-base")

    out = tmp_path / "roberta"
    extra = (
        f"--recipe roberta --steps 2 --grad-accum 2 --eval-batches 2 --eval-corpus {data['eval']}"
    )
    args = args_for(data, out, *extra.split())
    result = pretrain(args)
    assert "nsp_loss" not in result["train"] and "sop_loss" not in result["train"]
    assert "nsp_accuracy" not in result["eval"]
    saved = json.loads((out / "pretrain_args.json").read_text())
    assert (saved["recipe"], saved["adam_beta2"], saved["grad_accum"]) == ("roberta", 0.98, 2)


def test_pretraining_without_dropout_leaves_fine_tuning_its_dropout(data, tmp_path):
    first = {}
    for name, extra in (("default", ()), ("none", ("--dropout", "0"))):
        pretrain(
            args_for(
                data, tmp_path / name, "--steps", "2", "--log-every", "1", "--seed", "3", *extra
            )
        )
        first[name] = train_rows(tmp_path / name)[0]["loss"]
        saved = json.loads((tmp_path / name / "config.json").read_text())
        assert saved["hidden_dropout_prob"] == saved["attention_probs_dropout_prob"] == 0.1
    assert first["none"] != first["default"]  # the same seed and batches: only dropout differs
    model = BertForPreTraining(BertConfig.load(data["config"])).train()
    set_dropout(model, 0.0)
    ids = torch.randint(5, 50, (2, 16))
    torch.testing.assert_close(model(ids).prediction_logits, model(ids).prediction_logits)
    with pytest.raises(SystemExit, match="--dropout must be in"):
        pretrain(args_for(data, tmp_path / "bad", "--steps", "1", "--dropout", "1"))


def test_a_time_budget_stops_the_run_and_decays_the_rate(data, tmp_path):
    result = pretrain(args_for(data, tmp_path / "timed", "--time-budget", "1.5s", "--warmup", "1"))
    assert result["step"] > 1
    assert result["train"]["lr"] < 1e-4 * 0.5  # most of the budget spent: mostly decayed


def test_bad_input_fails_with_a_message_naming_the_file(data, tmp_path, capsys):
    binary = tmp_path / "weights.bin"
    binary.write_bytes(bytes(range(256)) * 4)
    argv = f"--tokenizer train:100 --steps 1 --out {tmp_path / 'o'} --no-progress".split()
    assert main(["--corpus", str(data["train"]), str(binary), *argv]) == 2
    assert f"error: {binary}: looks binary" in capsys.readouterr().err
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    assert main(["--corpus", str(empty), *argv, "--cache-dir", str(tmp_path / "c")]) == 2
    assert "empty corpus" in capsys.readouterr().err


def test_an_existing_run_is_not_overwritten_without_resume(data, tmp_path):
    pretrain(args_for(data, tmp_path / "run", "--steps", "1"))
    with pytest.raises(SystemExit, match="holds a run already"):
        pretrain(args_for(data, tmp_path / "run", "--steps", "1"))


def test_help_teaches_with_commands(monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    text = build_parser().format_help()
    assert "python -m training.pretrain --corpus" in text
    assert "torchrun --nproc_per_node" in text
    for flag in (
        "--recipe",
        "--objective",
        "--whole-word-masking",
        "--time-budget",
        "--grad-accum",
        "--resume",
    ):
        assert flag in text


# --- the pieces -------------------------------------------------------------------------


def test_flops_per_token_counts_the_model_weights_a_token_passes_through():
    config = BertConfig.preset("tiny", vocab_size=1000)
    model = BertForPreTraining(config)
    encoder = sum(
        m.weight.numel() for m in model.bert.encoder.modules() if isinstance(m, torch.nn.Linear)
    )
    head = (
        model.cls.predictions.transform.dense.weight.numel()
        + model.cls.predictions.decoder.weight.numel()
    )
    L, H = config.num_hidden_layers, config.hidden_size
    expected = 6 * encoder + 6 * 0.15 * head + 12 * L * H * 128
    assert flops_per_token(config, 128, 0.15) == pytest.approx(expected)


def test_durations():
    durations = [duration(t) for t in ("90", "90s", "30m", "2h", "1h30m", "1.5s")]
    assert durations == [90, 90, 1800, 7200, 5400, 1.5]
    with pytest.raises(Exception, match="not a duration"):
        duration("soon")


# ~15 s: CI's slow stage runs DDP (torchrun, gloo) for real
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_two_processes_with_torchrun_on_cpu(data, tmp_path):
    """DDP over gloo: both ranks train, rank 0 writes one checkpoint."""
    out = tmp_path / "ddp"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    args = (
        f"--corpus {data['train']} --tokenizer {data['tokenizer']} --config {data['config']} "
        f"--max-seq-length 32 --batch-size 4 --grad-accum 2 --steps 4 --log-every 1 "
        f"--cache-dir {tmp_path / 'cache'} --out {out} --no-progress"
    )
    cmd = [*torchrun, "-m", "training.pretrain", *args.split()]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(cmd, cwd=REPO, env=env, check=True, timeout=300)
    rows = train_rows(out)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert json.loads((out / "pretrain_args.json").read_text())["grad_accum"] == 2
    # both ranks' data position and RNG are in the checkpoint, for an exact --resume
    state = torch.load(out / "trainer_state.pt", weights_only=False)
    assert (state["step"], state["world_size"], len(state["ranks"])) == (4, 2, 2)
    data = [r["data"] for r in state["ranks"]]
    assert data[0]["position"] == data[1]["position"] == 4 * 2 * 4  # steps x accum x batch
    rng = [r["rng"]["torch"] for r in state["ranks"]]
    assert not torch.equal(rng[0], rng[1])  # dropout of its own per rank
