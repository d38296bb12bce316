"""Dynamic padding: a list of model rows -> one batch of tensors, padded to its longest row.

A row is a dict {"sequence": heads.rows.ModelRow, ...targets}; a row may also hold a
"pair" Sequence (embedding training), which goes into the same batch after all the
"sequence"s. Scalar targets stack to (B,); per-token targets (L,) are padded with -100.

    >>> batch = collate([{"sequence": s, "labels": 1}, ...])
    >>> batch["input_ids"].shape, batch["attention_mask"].shape, batch["labels"].shape
    (torch.Size([B, T]), torch.Size([B, T]), torch.Size([B]))
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from heads.rows import pad as pad_sequences  # the service's padding: one definition

IGNORE = -100


def collate(rows: list[dict], pad_id: int = 0) -> dict[str, Tensor]:
    sequences = [r["sequence"] for r in rows] + [r["pair"] for r in rows if "pair" in r]
    batch = {k: torch.from_numpy(v) for k, v in pad_sequences(sequences, pad_id).items()}
    T = batch["input_ids"].shape[1]
    for key in rows[0].keys() - {"sequence", "pair"}:
        values = [r[key] for r in rows]
        if np.ndim(values[0]) == 0:
            batch[key] = torch.tensor(values, dtype=torch.int64)
        else:
            padded = np.full((len(values), T), IGNORE, dtype=np.int64)
            for i, v in enumerate(values):
                padded[i, : len(v)] = v
            batch[key] = torch.from_numpy(padded)
    return batch
