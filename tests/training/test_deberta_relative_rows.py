"""DeBERTa's disentangled attention scores only the rows of its distance table that a row of T
tokens reaches (2 reach + 1 of 2 span: at T = 32 with DeBERTa-v3's 256 buckets, 63 of 512),
which made the exported base-size graph 8-19% faster on CPU (benchmarks/README.md, issue 46).
The terms must equal those scored against the whole table, distances clamped into it, at every
T: short rows, rows whose distances are log-bucketed, rows past the table (clamped)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from training.families.deberta_v2 import DisentangledSelfAttention, RelativePositions

transformers = pytest.importorskip("transformers")

CONFIGS: dict[str, dict[str, Any]] = {
    "v3 buckets": dict(position_buckets=8, max_relative_positions=32, share_att_key=True),
    "v2 plain distances": dict(position_buckets=-1, max_relative_positions=16),
}


def full_table_terms(
    attn: DisentangledSelfAttention, query, key, relative, rel_embeddings
) -> torch.Tensor:
    """c2p + p2c / scale against all 2 span rows (the computation before the rows were cut)."""
    span, terms = attn.span, []
    if attn.c2p:
        proj = attn.key_proj if attn.share_att_key else attn.pos_key_proj
        by_distance = query @ attn._heads(proj(rel_embeddings)).transpose(-1, -2)
        index = torch.clamp(relative + span, 0, 2 * span - 1)
        terms.append(torch.gather(by_distance, -1, index.expand(*by_distance.shape[:2], -1, -1)))
    if attn.p2c:
        proj = attn.query_proj if attn.share_att_key else attn.pos_query_proj
        by_distance = key @ attn._heads(proj(rel_embeddings)).transpose(-1, -2)
        index = torch.clamp(span - relative, 0, 2 * span - 1)
        gathered = torch.gather(by_distance, -1, index.expand(*by_distance.shape[:2], -1, -1))
        terms.append(gathered.transpose(-1, -2))
    return sum(terms[1:], terms[0]) / attn.scale


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("T", [1, 3, 9, 40, 70])  # 40, 70: past the table (clamped)
def test_terms_equal_those_against_the_whole_table(name: str, T: int) -> None:
    config = transformers.DebertaV2Config(
        hidden_size=32, num_attention_heads=4, max_position_embeddings=128,
        relative_attention=True, pos_att_type=["p2c", "c2p"], **CONFIGS[name],
    )  # fmt: skip
    torch.manual_seed(0)
    attn = DisentangledSelfAttention(config).eval()
    positions = RelativePositions(config.max_relative_positions, config.position_buckets)
    span = attn.span
    hidden = torch.randn(2, T, 32)
    rel_embeddings = torch.randn(2 * span, 32)
    relative = positions(hidden)
    query = attn._heads(attn.query_proj(hidden))
    key = attn._heads(attn.key_proj(hidden))
    scores = query @ key.transpose(-1, -2)
    with torch.no_grad():
        got = attn._relative_scores(query, key, relative, rel_embeddings, scores)
        want = full_table_terms(attn, query, key, relative, rel_embeddings)
    assert got.shape == (2, 4, T, T)
    assert torch.allclose(got, want, atol=1e-6, rtol=0)
