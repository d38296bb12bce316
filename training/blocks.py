"""What every post-norm encoder layer here is made of, under BERT's module names (transformers'
modeling_bert.py): the activations config.json may name, the attention output block, and the
feed-forward block. training.model (BERT and the families that are BERT with options) and the
family modules with encoders of their own (DeBERTa-v2, MPNet) build their layers from these;
this module imports neither."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor, nn

# transformers' activation names (ACT2FN keys) -> a fresh module
ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "gelu": nn.GELU,  # exact erf GELU, as the original BERT code
    "gelu_new": lambda: nn.GELU(approximate="tanh"),
    "gelu_pytorch_tanh": lambda: nn.GELU(approximate="tanh"),
    "relu": nn.ReLU,
    "tanh": nn.Tanh,  # RoBERTa's classification head
    "silu": nn.SiLU,
    "swish": nn.SiLU,
}


def activation(name: str) -> nn.Module:
    """The activation config.json names; ValueError naming the supported ones."""
    if name not in ACTIVATIONS:
        raise ValueError(f"activation {name!r} is not one of {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[name]()


class BertSelfOutput(nn.Module):
    """Attention output: dense, dropout, residual add, LayerNorm (post-LN, as in BERT)."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, y: Tensor, residual: Tensor) -> Tensor:
        """y, residual (B, T, H) -> (B, T, H)."""
        return self.LayerNorm(self.dropout(self.dense(y)) + residual)


class BertIntermediate(nn.Module):
    """The feed-forward block's widening half: H -> intermediate_size, then hidden_act."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.act = activation(config.hidden_act)

    def forward(self, x: Tensor) -> Tensor:
        return self.act(self.dense(x))


class BertOutput(BertSelfOutput):
    """The feed-forward block's narrowing half: back to H, dropout, residual, LayerNorm."""

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.dense = nn.Linear(config.intermediate_size, config.hidden_size)
