"""training.trainer, the one loop, on a toy regression: the two learning-rate schedules, a
stop request (SIGTERM) that checkpoints and a resume that repeats the uninterrupted run
exactly, and gradient accumulation that equals the large batch."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch
from torch import nn

from training.plots import read_log
from training.trainer import Dist, LoopConfig, Trainer, get_lr


class Regression:
    """Batches: consecutive rows x (rows, 3) of a fixed N(0, 1) sample, y = sum(x)."""

    X = torch.randn(400, 3, generator=torch.Generator().manual_seed(0))

    def __init__(self, rows: int = 4) -> None:
        self.rows, self.position = rows, 0

    @property
    def epoch(self) -> float:
        return self.position * self.rows // 20  # 20 rows an "epoch"

    def next_batch(self) -> dict[str, torch.Tensor]:
        x = self.X[self.position * self.rows : (self.position + 1) * self.rows]
        self.position += 1
        return {"input_ids": x, "attention_mask": torch.ones(len(x), 3), "y": x.sum(-1)}

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = state["position"]


def mse(model: nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {"loss": ((model(batch["input_ids"]).squeeze(-1) - batch["y"]) ** 2).mean()}


def toy_model(seed: int, dropout: float = 0.1) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 8), nn.Dropout(dropout), nn.Linear(8, 1))


def trainer(model: nn.Module, out: Path, loss=mse, data=None, **loop) -> Trainer:
    settings = dict(lr=1e-2, steps=10, warmup=2, log_every=1, save_every=3, progress=False)
    return Trainer(
        Dist(),
        model,
        data or Regression(),
        loss,
        LoopConfig(**(settings | loop)),
        out=out,
        checkpoint=out / "last",
        write_model=lambda folder: torch.save(model.state_dict(), folder / "model.pt"),
    )


def train_rows(out: Path) -> list[tuple]:
    rows = read_log(out / "log.jsonl")
    return [(r["step"], r["loss"], r["lr"], r["grad_norm"]) for r in rows if r["split"] == "train"]


def test_schedules_warm_up_then_decay_linearly_to_zero():
    # pretraining: BERT's optimization.py, the decay measured from step 0
    lrs = [get_lr(s, 1.0, 10, now=s, end=100) for s in range(101)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert lrs[10] == pytest.approx(0.9) and lrs[55] == pytest.approx(0.45) and lrs[100] == 0.0
    # the same over a time budget: 30 of 60 seconds spent
    assert get_lr(500, 1.0, 10, now=30.0, end=60.0) == pytest.approx(0.5)
    # fine-tuning: transformers' linear schedule, the full rate right after warm-up
    lrs = [get_lr(s, 1.0, 4, now=s, end=12, decay_from=4) for s in range(12)]
    assert lrs[:4] == [0.25, 0.5, 0.75, 1.0]
    assert lrs[4] == 1.0 and lrs[-1] == pytest.approx(1 / 8)
    assert all(a > b for a, b in zip(lrs[4:], lrs[5:], strict=False))
    assert get_lr(0, 1.0, 0, now=0, end=10, decay_from=0) == 1.0


def test_a_stop_request_checkpoints_and_the_resume_repeats_the_run_exactly(tmp_path):
    straight = trainer(toy_model(0), tmp_path / "straight")
    straight.start(None)
    assert straight.fit() is True and straight.step == 10

    calls = {"n": 0}

    def preempted(model, batch):  # a scheduler's SIGTERM arrives during step 5
        calls["n"] += 1
        if calls["n"] == 5:
            os.kill(os.getpid(), signal.SIGTERM)
        return mse(model, batch)

    stopped = trainer(toy_model(0), tmp_path / "split", loss=preempted)
    stopped.start(None)
    assert stopped.fit() is False and stopped.step == 5
    state = Trainer.load_state(tmp_path / "split" / "last")
    assert state is not None and state["step"] == 5

    model = toy_model(seed=123)  # other weights, other RNG: everything comes from the checkpoint
    model.load_state_dict(torch.load(tmp_path / "split" / "last" / "model.pt"))
    resumed = trainer(model, tmp_path / "split")
    resumed.start(state)
    assert resumed.fit() is True
    assert train_rows(tmp_path / "split") == train_rows(tmp_path / "straight")  # float for float
    a = torch.load(tmp_path / "straight" / "last" / "model.pt")
    b = torch.load(tmp_path / "split" / "last" / "model.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_accumulated_micro_batches_step_as_the_large_batch(tmp_path):
    small = trainer(toy_model(0, 0.0), tmp_path / "a", steps=1, warmup=0, grad_accum=2)
    large = trainer(toy_model(0, 0.0), tmp_path / "b", steps=1, warmup=0, data=Regression(8))
    for t in (small, large):
        t.start(None)
        t.fit()
    # the two micro-batches of 4 are the large batch's 8 rows
    for p, q in zip(small.model.parameters(), large.model.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=1e-7, rtol=0)
    assert small.last_train["seq_per_s"] > 0 and small.meter.micro_batches == 0
