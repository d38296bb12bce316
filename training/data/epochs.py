"""Epochs over a list of encoded rows, for the training loop (training.trainer's `Batches`).

    data = EpochBatches(rows, batch_size=16, seed=42, rank=0, world=1)
    batch = data.next_batch()      # padded tensors of 16 rows; data.epoch 0.0625 of 16 batches

Every process draws the same seeded shuffle per epoch (DistributedSampler) and takes its share;
`group_by_length` batches rows of similar length together. A (seed, epoch) always gives the
same batches, so a saved (epoch, position) resumes exactly.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any, cast

from torch import Tensor
from torch.utils.data import Dataset, DistributedSampler

from training.data.batch import collate

GROUP_BATCHES = 50  # group_by_length sorts runs of this many batches


def epoch_batches(
    sampler: DistributedSampler, epoch: int, batch_size: int, lengths: Sequence[int] | None = None
) -> list[list[int]]:
    """This process's batches of row indices for one epoch: a seeded shuffle that every
    process draws alike (DistributedSampler.set_epoch), split between processes.

    With `lengths` (group_by_length) each run of GROUP_BATCHES batches of the shuffle is sorted
    by row length before it is cut, so a batch pads to little more than its rows, and the
    batches are then shuffled with the same seed: the order stays random and a given
    (seed, epoch) always gives the same batches, which a resume relies on."""
    sampler.set_epoch(epoch)
    indices = list(sampler)
    if lengths is None:
        return [indices[i : i + batch_size] for i in range(0, len(indices), batch_size)]
    span = batch_size * GROUP_BATCHES
    batches = []
    for start in range(0, len(indices), span):
        run = sorted(indices[start : start + span], key=lambda i: lengths[i], reverse=True)
        batches += [run[i : i + batch_size] for i in range(0, len(run), batch_size)]
    random.Random(sampler.seed * 100_003 + epoch).shuffle(batches)
    return batches


class EpochBatches:
    """Batches over a list of rows, epoch after epoch: this process's share of a seeded shuffle
    (epoch_batches), `batch_size` rows padded together by collate. training.trainer's
    Batches: `epoch` counts passes, state_dict() is where the next batch comes from."""

    def __init__(
        self,
        rows: list[dict],
        batch_size: int,
        seed: int,
        rank: int = 0,
        world: int = 1,
        pad_id: int = 0,
        lengths: Sequence[int] | None = None,
    ) -> None:
        self.rows, self.batch_size, self.pad_id, self.lengths = rows, batch_size, pad_id, lengths
        # The sampler only takes len() of its dataset; the stubs want a Dataset, not a list.
        self.sampler: DistributedSampler[int] = DistributedSampler(
            cast(Dataset, rows), world, rank, shuffle=True, seed=seed
        )
        self.steps_per_epoch = math.ceil(len(self.sampler) / batch_size)
        self.index = self.position = 0  # the epoch, and the batches done in it
        self._batches: list[list[int]] = []
        self._loaded: int | None = None

    @property
    def epoch(self) -> float:
        return self.index + self.position / self.steps_per_epoch

    def next_batch(self) -> dict[str, Tensor]:
        if self._loaded != self.index:
            self._batches = epoch_batches(self.sampler, self.index, self.batch_size, self.lengths)
            self._loaded = self.index
        indices = self._batches[self.position]
        self.position += 1
        if self.position == len(self._batches):
            self.index, self.position = self.index + 1, 0
        return collate([self.rows[i] for i in indices], self.pad_id)

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.index, "position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.index, self.position = state["epoch"], state["position"]
