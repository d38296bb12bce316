"""training.distill: the student starts from one teacher layer out of two, the triple loss's
terms equal their hand-computed values, and a tiny run brings the student's predictions
closer to the teacher's."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from tests.training.tiny import tiny_bert_config, tiny_tokenizer
from training.checkpoint import load_model, save_model
from training.distill import (
    TripleLoss,
    cosine_loss,
    every_other_layer,
    main,
    make_student,
    parse_args,
    soft_target_loss,
)
from training.model import BertForSequenceClassification, BertForTokenClassification

SENTENCES = [
    "the film is good",
    "a great movie",
    "an awful film",
    "the movie was bad",
    "john lives in paris",
    "what a film",
    "where is france",
    "who is john smith",
]


def _perturbed(model: torch.nn.Module, scale: float = 0.3) -> torch.nn.Module:
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
    return model.eval()


# --- the student ----------------------------------------------------------------------------


def test_one_layer_out_of_two():
    assert every_other_layer(6, 3) == [0, 2, 4]
    assert every_other_layer(12, 6) == [0, 2, 4, 6, 8, 10]
    assert every_other_layer(12, 4) == [0, 3, 6, 9]
    assert every_other_layer(4, 4) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="must be 1..6"):
        every_other_layer(6, 7)


def test_the_student_copies_the_chosen_teacher_layers_and_everything_else(tiny_config):
    torch.manual_seed(0)
    teacher = _perturbed(
        BertForTokenClassification(tiny_config.replace(num_hidden_layers=4), num_labels=5)
    )
    student = make_student(teacher, [0, 2])
    assert student.config.num_hidden_layers == 2 and student.num_labels == 5
    t, s = teacher.state_dict(), student.state_dict()
    for j, i in enumerate([0, 2]):
        ours = {k for k in s if k.startswith(f"bert.encoder.layer.{j}.")}
        assert ours
        for k in ours:
            assert torch.equal(s[k], t[k.replace(f"layer.{j}.", f"layer.{i}.")])
    rest = [k for k in s if not k.startswith("bert.encoder.layer.")]
    assert "classifier.weight" in rest and "bert.embeddings.word_embeddings.weight" in rest
    assert all(torch.equal(s[k], t[k]) for k in rest)
    assert s["classifier.weight"].data_ptr() != t["classifier.weight"].data_ptr()  # copies


def test_an_albert_student_keeps_the_shared_layer(tiny_config):
    config = tiny_config.replace(embedding_size=16, share_layers=True, num_hidden_layers=6)
    teacher = _perturbed(BertForSequenceClassification(config, num_labels=2))
    student = make_student(teacher, every_other_layer(6, 3))
    assert student.config.num_hidden_layers == 3 and len(student.bert.encoder.layer) == 1
    t, s = teacher.state_dict(), student.state_dict()
    assert all(torch.equal(s[k], t[k]) for k in s)


# --- the loss terms on known tensors ---------------------------------------------------------


def test_soft_target_loss_by_hand():
    # teacher softmax (3/4, 1/4), student (1/2, 1/2): KL = 3/4 ln(3/2) + 1/4 ln(1/2)
    kl = 0.75 * math.log(1.5) + 0.25 * math.log(0.5)
    assert kl == pytest.approx(0.130812, abs=1e-6)
    teacher, student = torch.tensor([[math.log(3), 0.0]]), torch.zeros(1, 2)
    assert soft_target_loss(student, teacher, 1.0).item() == pytest.approx(kl, abs=1e-6)
    # at T = 2 the same distributions need logits twice as far apart; the loss is scaled by T^2
    assert soft_target_loss(student, 2 * teacher, 2.0).item() == pytest.approx(4 * kl, abs=1e-6)
    # averaged over rows: a second row where the two agree adds 0
    two = soft_target_loss(torch.zeros(2, 2), torch.tensor([[math.log(3), 0.0], [5.0, 5.0]]), 1.0)
    assert two.item() == pytest.approx(kl / 2, abs=1e-6)
    assert soft_target_loss(teacher, teacher, 3.0).item() == pytest.approx(0.0, abs=1e-6)


def test_cosine_loss_by_hand_skips_padding():
    student = torch.tensor([[[1.0, 0.0], [0.0, 2.0], [7.0, -1.0]]])  # (B 1, T 3, H 2)
    teacher = torch.tensor([[[3.0, 0.0], [1.0, 0.0], [1.0, 1.0]]])
    mask = torch.tensor([[1, 1, 0]])  # the third token is padding
    # cos 1 (same direction, other length) and 0 (orthogonal): mean of 1 - cos = 1/2
    assert cosine_loss(student, teacher, mask).item() == pytest.approx(0.5, abs=1e-7)
    opposite = cosine_loss(-teacher, teacher, torch.ones(1, 3)).item()
    assert opposite == pytest.approx(2.0, abs=1e-6)


def test_the_triple_loss_weighs_its_parts(tiny_config, batch):
    torch.manual_seed(0)
    teacher = _perturbed(BertForSequenceClassification(tiny_config, num_labels=2))
    student = make_student(teacher, [0])
    labels = {**batch, "labels": torch.tensor([0, 1, 1])}
    loss = TripleLoss(teacher, temperature=2.0, alpha_kd=5.0, alpha_cos=1.0, alpha_task=2.0)
    p = loss.parts(student.eval(), "classification", labels)
    with torch.no_grad():
        t, s = teacher(**batch).logits, student(**labels)
        hs, ht = student.bert(**batch).last_hidden_state, teacher.bert(**batch).last_hidden_state
    expected_kd = F.kl_div(
        F.log_softmax(s.logits / 2, -1), F.softmax(t / 2, -1), reduction="batchmean"
    )
    torch.testing.assert_close(p["kd"], expected_kd * 4)
    torch.testing.assert_close(p["task"], s.loss)
    torch.testing.assert_close(p["cos"], cosine_loss(hs, ht, batch["attention_mask"]))
    assert p["kd"] > 0 and p["cos"] > 0
    total = loss(student, "classification", labels)["loss"]
    torch.testing.assert_close(total, 5 * p["kd"] + p["cos"] + 2 * p["task"])
    # a student identical to its teacher has nothing to learn from it
    same = TripleLoss(teacher).parts(teacher, "classification", labels)
    assert same["kd"].item() == pytest.approx(0, abs=1e-6) and same["cos"].item() < 1e-6


# --- a tiny run -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("teacher")
    tok = tiny_tokenizer(root / "vocab")
    config = tiny_bert_config(tok.get_vocab_size()).replace(
        num_hidden_layers=4, id2label={0: "0", 1: "1"}
    )
    torch.manual_seed(0)
    teacher = _perturbed(BertForSequenceClassification(config), scale=0.5)
    return save_model(teacher, root / "best", tok)


def _logits(model, tok, sentences) -> torch.Tensor:
    enc = [tok.encode(s).ids for s in sentences]
    T = max(map(len, enc))
    ids = torch.tensor([e + [0] * (T - len(e)) for e in enc])
    with torch.no_grad():
        return model.eval()(ids, (ids != 0).long()).logits


def test_a_tiny_distillation_brings_the_student_closer_to_the_teacher(teacher_dir, tmp_path):
    data = tmp_path / "train.tsv"
    data.write_text("sentence\tlabel\n" + "".join(f"{s}\t{i % 2}\n" for i, s in enumerate(SENTENCES)))  # fmt: skip
    teacher = load_model(teacher_dir)
    tok = tiny_tokenizer(tmp_path / "vocab")
    before = make_student(teacher, every_other_layer(4, 2))
    argv = (
        f"--teacher {teacher_dir} --student-layers 2 --task classification --train {data} "
        f"--eval {data} --out {tmp_path / 'run'} --epochs 12 --batch-size 4 --lr 3e-3 "
        "--alpha-task 0 --warmup-ratio 0 --log-every 1 --export"
    ).split()
    assert main(argv) == 0
    after = load_model(tmp_path / "run" / "last")
    assert after.config.num_hidden_layers == 2

    t = _logits(teacher, tok, SENTENCES)

    def disagreement(student) -> float:
        return soft_target_loss(_logits(student, tok, SENTENCES), t, 1.0).item()

    print(f"\nKL(teacher || student): {disagreement(before):.4f} -> {disagreement(after):.4f}")
    assert disagreement(after) < 0.5 * disagreement(before)
    summary = json.loads((tmp_path / "run" / "metrics.json").read_text())
    d = summary["distillation"]
    assert d["student_layers_from"] == [0, 2] and d["teacher_layers"] == 4
    assert "accuracy" in d["teacher_metrics"] and d["student_over_teacher"] > 0
    assert (tmp_path / "run" / "package" / "package.json").is_file()


def test_help_and_refusals(capsys, teacher_dir, tmp_path):
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    text = capsys.readouterr().out
    for option in ("--teacher", "--student-layers", "--temperature", "--alpha-kd", "--alpha-cos",
                   "--alpha-task", "--epochs", "--lr", "--batch-size", "--max-steps", "--seed",
                   "--export"):  # fmt: skip
        assert option in text
    assert "--init INIT" not in text and "0,2,4" in text
    base = f"--teacher {teacher_dir} --train x --out {tmp_path} --task classification".split()
    assert main([*base, "--student-layers", "5"]) == 2
    assert "must be 1..4" in capsys.readouterr().err
    assert main([*base, "--student-layers", "2", "--teacher-layers", "0,9"]) == 2
    assert "--teacher-layers needs 2 indices in 0..3" in capsys.readouterr().err
