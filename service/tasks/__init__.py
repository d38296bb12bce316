"""One module per head, each in three steps: `encode_pre` (text -> model rows), the batcher
runs the rows, `encode_post` (model outputs -> answer).

Pre- and post-processing are plain functions over `tokenizers` encodings and numpy arrays, so
`training.evaluate` scores exactly what the service answers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class Sequence:
    """One unpadded model input row. The batcher pads rows and builds the attention mask.

    input_ids, token_type_ids: (L,) int64.
    """

    input_ids: np.ndarray
    token_type_ids: np.ndarray

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])


# What the batcher hands back for one Sequence: output name -> array with the batch axis
# removed and, for per-token outputs, the padding cut off: logits (C,) or (L, C),
# start_logits / end_logits (L,), embeddings (H,).
Outputs = dict[str, np.ndarray]
