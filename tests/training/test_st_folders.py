"""Any BERT-family sentence-transformers folder (issue 17): Pooling cls, mean, max or
mean_sqrt_len_tokens, Dense modules (with their activation) and Normalize load here equal to
`SentenceTransformer(folder)`, export into one graph, and save back as a folder it opens;
prompts go into package.json; any other module is refused by name, in one line.

The folders are built with sentence-transformers' own module classes around the tiny
`save_pretrained` checkpoints of tests/families.py, and saved with its `save`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.families import family_checkpoint

torch = pytest.importorskip("torch")
st = pytest.importorskip("sentence_transformers")
# our own modules, imported plainly: an error in them fails these tests instead of skipping them
from training import checkpoint, export, tokenizer  # noqa: E402

# Lengths 3 to 30 tokens in one batch: padding is where cls, mean and max pooling differ.
TEXTS = [
    "Hi",
    "Café au lait in Zürich 🙂",
    "The film was long , the music brilliant and the ending dull , as the critics said .",
    "São Paulo",
]
ACTIVATIONS = {"tanh": "Tanh", "identity": "Identity", "relu": "ReLU", "gelu": "GELU"}
WIDTHS = (24, 16)  # the Dense modules' out_features, in order (the encoder's hidden size: 32)
MIN_COSINE = 0.99999


def st_folder(
    folder: Path,
    family: str,
    pooling: str,
    dense: tuple[str, ...] = (),
    normalize: bool = False,
    **model_args: Any,
) -> Path:
    """A sentence-transformers folder, saved by sentence-transformers: the family's tiny
    checkpoint, Pooling `pooling`, one Dense module per activation name in `dense` (random
    weights, seeded), Normalize when asked; model_args (prompts, default_prompt_name) go to
    SentenceTransformer."""
    from sentence_transformers import models

    transformer = models.Transformer(str(family_checkpoint(family, "embedding", seed=5)))
    modules = [transformer, models.Pooling(transformer.get_embedding_dimension(), pooling)]
    width = transformer.get_embedding_dimension()
    for i, name in enumerate(dense):
        with torch.random.fork_rng():
            torch.manual_seed(i)
            activation = getattr(torch.nn, ACTIVATIONS[name])()
            modules.append(models.Dense(width, WIDTHS[i], activation_function=activation))
        width = WIDTHS[i]
    if normalize:
        modules.append(models.Normalize())
    model = st.SentenceTransformer(modules=modules, device="cpu", **model_args)
    model.save(str(folder))
    return folder


def reference(folder: Path | Any, texts: list[str], **encode: Any) -> Any:
    """SentenceTransformer(folder).encode(texts) (folder: or the loaded model), one batch."""
    model = (
        st.SentenceTransformer(str(folder), device="cpu") if isinstance(folder, Path) else folder
    )
    return model.encode(texts, convert_to_tensor=True, batch_size=len(texts), **encode)


def cosines(a: Any, b: Any) -> list[float]:
    return torch.nn.functional.cosine_similarity(a.float(), b.float(), dim=-1).tolist()


CASES = [  # family, pooling, Dense activations, Normalize
    *[("bert", p, d, n) for p in ("cls", "mean", "max", "mean_sqrt_len_tokens")
      for d in ((), ("tanh",)) for n in (False, True)],
    ("electra", "max", ("tanh", "identity"), True),
    ("electra", "cls", ("relu",), False),
    ("roberta", "mean", ("gelu",), True),
    ("roberta", "max", (), False),
    ("distilbert", "cls", ("tanh",), True),
    ("distilbert", "max", ("identity",), False),
    ("mpnet", "mean", (), True),  # all-mpnet-base-v2's modules
    ("modernbert", "mean", (), True),
    ("modernbert", "cls", ("tanh",), False),
    ("deberta-v2", "mean", ("identity",), True),
]  # fmt: skip


@pytest.mark.parametrize("family, pooling, dense, normalize", CASES)
def test_folder_loads_equal_to_sentence_transformers(
    tmp_path: Path, family: str, pooling: str, dense: tuple[str, ...], normalize: bool
) -> None:
    folder = st_folder(tmp_path / "st", family, pooling, dense, normalize)
    model = checkpoint.load_model(folder)
    assert (model.pooling, model.normalize, len(model.dense)) == (pooling, normalize, len(dense))
    theirs_model = st.SentenceTransformer(str(folder), device="cpu")
    features = theirs_model.preprocess(TEXTS)  # their tokenization: the models alone compared
    with torch.inference_mode():
        ours = model(
            features["input_ids"], features["attention_mask"], features.get("token_type_ids")
        ).embeddings
    theirs = reference(theirs_model, TEXTS)
    assert ours.shape == theirs.shape == (len(TEXTS), WIDTHS[len(dense) - 1] if dense else 32)
    assert min(cosines(ours, theirs)) >= MIN_COSINE
    assert (ours - theirs).abs().max() <= 1e-5


def test_our_folder_with_dense_opens_in_sentence_transformers(tmp_path: Path) -> None:
    source = st_folder(tmp_path / "st", "electra", "max", ("tanh", "identity"), True)
    model = checkpoint.load_model(source)
    out = checkpoint.save_model(
        model, tmp_path / "ours", tokenizer=tokenizer.load_tokenizer(source)
    )
    saved = checkpoint.read_sentence_transformers(out)
    assert (saved.pooling, saved.normalize) == ("max", True)
    assert [(d["in_features"], d["out_features"]) for d in saved.dense] == [(32, 24), (24, 16)]
    assert not any(k.startswith("dense.") for k in checkpoint.load_state_dict_file(out))
    ours, theirs = reference(out, TEXTS), reference(source, TEXTS)
    assert (ours - theirs).abs().max() <= 1e-6
    again = checkpoint.load_model(out)
    for a, b in zip(again.state_dict().values(), model.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_export_puts_dense_in_the_graph_and_prompts_in_the_package(tmp_path: Path) -> None:
    prompts = {"query": "query: ", "passage": "passage: "}
    folder = st_folder(
        tmp_path / "st", "bert", "mean", ("tanh",), True,
        prompts=prompts, default_prompt_name="query",
    )  # fmt: skip
    pkg = export.export_package(folder, "embedding", tmp_path / "pkg", verbose=False)
    assert pkg.outputs[0]["shape"] == ["batch", 24]
    assert (pkg.pooling, pkg.normalize, pkg.default_prompt_name) == ("mean", True, "query")
    # sentence-transformers saves its built-in prompt names too, empty: "query" is ours here
    assert {k: v for k, v in pkg.prompts.items() if v} == prompts
    assert pkg.parity["fp32"]["max_abs_diff"]["embeddings"] <= export.FP32_TOLERANCE


def test_a_folder_without_prompts_exports_none(tmp_path: Path) -> None:
    folder = st_folder(tmp_path / "st", "bert", "cls")
    (folder / checkpoint.ST_CONFIG).unlink()
    pkg = export.export_package(folder, "embedding", tmp_path / "pkg", verbose=False)
    manifest = json.loads((pkg.path / "package.json").read_text())
    assert "prompts" not in manifest and (pkg.prompts, pkg.default_prompt_name) == ({}, None)


def _edit(path: Path, change: Any) -> None:
    path.write_text(json.dumps(change(json.loads(path.read_text()))))


def _lstm(modules: list[dict]) -> list[dict]:
    lstm = {"idx": 2, "name": "2", "path": "2_LSTM", "type": "sentence_transformers.models.LSTM"}
    return modules[:2] + [lstm] + modules[2:]


@pytest.mark.parametrize(
    "file, change, message",
    [
        ("modules.json", _lstm,
         r"modules.json: module sentence_transformers.models.LSTM is not supported "
         r"\(Transformer -> Pooling -> Dense... -> Normalize\)$"),
        ("modules.json", lambda m: [m[0], m[1], m[3], m[2]],
         r"modules Transformer -> Pooling -> Normalize -> Dense are not in the order served"),
        ("modules.json", lambda m: [m[0], {**m[1], "type": "my_package.Pooling"}, *m[2:]],
         r"module my_package.Pooling is not supported"),
        ("1_Pooling/config.json", lambda c: c | {"pooling_mode": ["mean", "max"]},
         r"1_Pooling/config.json: pooling mean \+ max is not supported \(one of mean, cls, max"),
        ("1_Pooling/config.json", lambda c: c | {"pooling_mode": "weightedmean"},
         r"pooling weightedmean is not supported"),
        ("2_Dense/config.json",
         lambda c: c | {"activation_function": "torch.nn.modules.activation.Softplus"},
         r"2_Dense/config.json: activation_function torch.nn.modules.activation.Softplus is not "
         r"supported"),
        ("2_Dense/config.json", lambda c: c | {"module_input_name": "token_embeddings"},
         r"a Dense module on \('token_embeddings', 'sentence_embedding'\) is not supported"),
        ("2_Dense/config.json", lambda c: c | {"in_features": 16},
         r"2_Dense/config.json: in_features 16, but the vector before it has 32"),
        ("2_Dense/config.json", lambda c: c | {"bias": False},
         r"2_Dense/model.safetensors: weights .* but .*2_Dense/config.json makes"),
        ("config_sentence_transformers.json", lambda c: c | {"default_prompt_name": "search"},
         r"default_prompt_name 'search' is not one of the prompts \(document, query\)"),
    ],
)  # fmt: skip
def test_what_we_do_not_reproduce_is_refused_in_one_line(
    tmp_path: Path, file: str, change: Any, message: str
) -> None:
    folder = st_folder(tmp_path / "st", "bert", "mean", ("tanh",), True)
    _edit(folder / file, change)
    with pytest.raises(checkpoint.CheckpointError, match=message) as caught:
        checkpoint.load_model(folder)
    assert "\n" not in str(caught.value)
    with pytest.raises(export.ExportError, match=message):
        export.export_package(folder, "embedding", tmp_path / "pkg", verbose=False)


def test_pooling_without_the_prompt_is_refused_at_export(tmp_path: Path) -> None:
    folder = st_folder(tmp_path / "st", "bert", "mean", prompts={"query": "query: "})
    _edit(folder / "1_Pooling" / "config.json", lambda c: c | {"include_prompt": False})
    with pytest.raises(export.ExportError, match=r"include_prompt false .* is not supported"):
        export.export_package(folder, "embedding", tmp_path / "pkg", verbose=False)
