"""LoRA (training/lora.py) against peft, its reference; and `training.finetune --lora-rank`:
what trains, what best/ holds, --merge, --resume, the --freeze-encoder adapter and the options
check() refuses. Tiny configs only: seconds on 2 cores."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.training.conftest import TINY
from training import finetune as ft
from training.checkpoint import load_model, load_state_dict_file
from training.config import BertConfig
from training.finetune import FinetuneArgs, finetune
from training.lora import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    LoraLinear,
    add_lora,
    encoder_digest,
    head_names,
    load_adapter,
    load_adapter_into,
    lora_modules,
    merge_lora,
)
from training.model import BertForSequenceClassification
from training.trainer import Dist

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

HF_HEADS = {
    "classification": "BertForSequenceClassification",
    "token-classification": "BertForTokenClassification",
}


def base_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The encoder's weights under their names without LoRA's wrappers (pooler excluded)."""
    return {
        k.replace(".base.", "."): v
        for k, v in model.state_dict().items()
        if k.startswith("bert.") and not k.startswith("bert.pooler.") and "lora_" not in k
    }


# --- against peft -------------------------------------------------------------------------


@pytest.mark.parametrize("task", HF_HEADS)
def test_lora_and_its_merge_match_peft(task, batch, tmp_path, parity):
    torch.manual_seed(0)
    hf_config = transformers.BertConfig(**TINY, num_labels=3)
    hf = getattr(transformers, HF_HEADS[task])(hf_config).eval()
    hf.save_pretrained(tmp_path / "hf")
    ours = load_model(tmp_path / "hf", task=task)
    with torch.no_grad():
        plain = hf(**batch).logits

    config = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["query", "value"])  # fmt: skip
    theirs = peft.get_peft_model(hf, config).eval()
    wrapped = add_lora(ours, rank=4, alpha=8, dropout=0.0, targets=["query", "value"])
    assert wrapped == [
        f"bert.encoder.layer.{i}.attention.self.{m}" for i in range(2) for m in ("query", "value")
    ]
    reference = theirs.base_model.model
    for name, module in lora_modules(ours).items():
        layer = reference.get_submodule(name)
        torch.nn.init.normal_(layer.lora_B["default"].weight)  # peft starts B at zero too
        module.lora_A.data.copy_(layer.lora_A["default"].weight)  # (r, in)
        module.lora_B.data.copy_(layer.lora_B["default"].weight)  # (out, r)
    ours.eval()

    with torch.no_grad():
        expected = theirs(**batch).logits
        got = ours(**batch).logits
        merged = merge_lora(copy.deepcopy(ours))
        from_merged = merged(**batch).logits
    assert (expected - plain).abs().max() > 1e-3  # the updates change the answer
    assert parity(f"lora {task} vs peft", got, expected) < 1e-5
    assert parity(f"lora {task} merged vs unmerged", from_merged, got) < 1e-5
    assert not any(isinstance(m, LoraLinear) for m in merged.modules())

    peft_merged = theirs.merge_and_unload()
    for name in wrapped:
        mine, ref = merged.get_submodule(name).weight, peft_merged.get_submodule(name).weight
        assert parity(f"lora {task} merged weights vs peft", mine, ref) < 1e-6


def test_add_lora_freezes_the_encoder_but_not_the_head_and_keeps_the_digest(tiny_config):
    model = BertForSequenceClassification(tiny_config, num_labels=2)
    digest = encoder_digest(model)
    add_lora(model, rank=2, alpha=4, dropout=0.1, targets=["query", "intermediate", "output"])
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trained == {
        f"bert.encoder.layer.{i}.{m}.lora_{x}"
        for i in range(2)
        for m in ("attention.self.query", "intermediate.dense", "output.dense")
        for x in "AB"
    } | set(head_names(model))
    assert head_names(model) == [
        "bert.pooler.dense.weight", "bert.pooler.dense.bias", "classifier.weight", "classifier.bias"
    ]  # fmt: skip
    assert encoder_digest(model) == digest
    assert all(torch.all(m.lora_B == 0) for m in lora_modules(model).values())


def test_families_with_their_own_encoder_are_refused_by_name(tiny_config):
    config = tiny_config.replace(model_type="modernbert", type_vocab_size=0)
    with pytest.raises(ValueError, match="modernbert encoder"):
        add_lora(BertForSequenceClassification(config, num_labels=2), 4, 8, 0.0, ["query"])
    with pytest.raises(ValueError, match="choose from query, key, value"):
        add_lora(BertForSequenceClassification(tiny_config), 4, 8, 0.0, ["qkv"])


# --- fine-tuning with --lora-rank ---------------------------------------------------------


def lora_args(init, sentiment, out, **overrides) -> FinetuneArgs:
    args = FinetuneArgs(
        task="classification", init=str(init), train=str(sentiment), eval=str(sentiment),
        out=str(out), batch_size=4, epochs=1, lr=1e-2, log_every=1, lora_rank=4,
    )  # fmt: skip
    return ft.dataclasses.replace(args, **overrides)


def test_lora_trains_the_updates_and_the_head_not_the_encoder(init, sentiment, tmp_path, capsys):
    built = {}

    def build(args, source, labels):
        built["model"] = ft.build_model(args, source, labels)
        built["head"] = built["model"].classifier.weight.detach().clone()
        return built["model"]

    result = finetune(lora_args(init, sentiment, tmp_path / "run"), build=build)
    model = built["model"]
    start = load_model(init, task="classification", labels=["0", "1"])
    before, after = base_weights(start), base_weights(model)
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)  # bit for bit
    assert all(torch.any(m.lora_B != 0) for m in lora_modules(model).values())
    assert not torch.equal(model.classifier.weight, built["head"])
    assert "LoRA rank 4 on query,value: 0.00M of " in capsys.readouterr().err

    best = result.best_dir
    assert (best / ADAPTER_CONFIG).is_file() and (best / ADAPTER_WEIGHTS).is_file()
    assert not (best / "model.safetensors").exists()
    assert BertConfig.load(best).labels == ["0", "1"]  # config.json as any checkpoint's
    meta, tensors = load_adapter(best)
    assert meta["kind"] == "lora" and meta["task"] == "classification"
    assert (meta["rank"], meta["alpha"], meta["dropout"]) == (4, 8.0, 0.1)
    assert meta["targets"] == ["query", "value"] and len(meta["modules"]) == 4
    assert meta["base"] == {"digest": encoder_digest(start), "checkpoint": str(init)}
    assert set(tensors) == {f"{m}.lora_{x}" for m in meta["modules"] for x in "AB"} | set(
        meta["head"]
    )
    assert tensors[f"{meta['modules'][0]}.lora_A"].shape == (4, 32)  # (r, in)


def test_merge_writes_the_full_checkpoint_the_adapter_stands_for(init, sentiment, tmp_path, batch):
    result = finetune(lora_args(init, sentiment, tmp_path / "run", merge=True))
    merged = load_model(result.best_dir, task="classification")
    adapted = load_model(init, task="classification", labels=["0", "1"])
    add_lora(adapted, rank=4, alpha=8, dropout=0.1, targets=["query", "value"])
    load_adapter_into(adapted, result.best_dir)
    with torch.no_grad():
        a = merged(**batch).logits
        b = adapted.eval()(**batch).logits
    torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    assert (result.best_dir / ADAPTER_CONFIG).is_file()
    assert (result.out / "last" / "model.safetensors").is_file()


def test_resume_repeats_the_uninterrupted_lora_run(init, sentiment, tmp_path):
    args = lora_args(init, sentiment, tmp_path / "straight", epochs=2, save_every=3)
    finetune(args)
    calls = {"n": 0}

    def interrupted(*a):
        calls["n"] += 1
        if calls["n"] == 6:  # saved at steps 3 and 4 (the epoch's end)
            raise KeyboardInterrupt
        return ft.compute_loss(*a)

    again = ft.dataclasses.replace(args, out=str(tmp_path / "resumed"))
    with pytest.raises(KeyboardInterrupt):
        finetune(again, loss_fn=interrupted)
    finetune(ft.dataclasses.replace(again, resume=True))
    straight = load_adapter(tmp_path / "straight" / "last")[1]
    resumed = load_adapter(tmp_path / "resumed" / "last")[1]
    assert straight.keys() == resumed.keys()
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)
    with pytest.raises(ValueError, match="trained with --lora-rank 4, not 0"):
        finetune(ft.dataclasses.replace(again, resume=True, lora_rank=0))


def test_a_frozen_encoder_run_also_writes_a_head_only_adapter(init, sentiment, tmp_path):
    args = lora_args(init, sentiment, tmp_path / "run", lora_rank=0, freeze_encoder=True)
    best = finetune(args).best_dir
    meta, tensors = load_adapter(best)
    assert (meta["kind"], meta["rank"], meta["modules"], meta["targets"]) == ("frozen", 0, [], [])
    assert set(tensors) == set(meta["head"]) == {
        "bert.pooler.dense.weight", "bert.pooler.dense.bias", "classifier.weight", "classifier.bias"
    }  # fmt: skip
    full = load_state_dict_file(best)  # the full checkpoint is still written
    assert torch.equal(full["classifier.weight"], tensors["classifier.weight"])
    assert meta["base"]["digest"] == encoder_digest(load_model(init, task="classification"))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"task": "embedding"}, "--lora-rank is for classification, token-classification"),
        ({"task": "fill-mask"}, "unknown task 'fill-mask'"),
        ({"freeze_encoder": True}, "choose one"),
        ({"export": True}, "--base-package BASE_PACKAGE"),
        ({"lora_rank": 0, "merge": True}, "--merge is for --lora-rank"),
        ({"lora_targets": "query,ffn"}, "ffn: choose from query"),
    ],
)
def test_check_refuses_what_lora_cannot_do(overrides, message):
    args = lora_args("init", "train.tsv", "runs/x", **overrides)
    with pytest.raises(ValueError, match=message):
        ft.check(args, Dist())


def test_export_with_merge_is_allowed_and_help_lists_the_options(capsys):
    ft.check(lora_args("init", "train.tsv", "runs/x", export=True, merge=True), Dist())
    with pytest.raises(SystemExit):
        ft.parse_args(["--help"])
    text = capsys.readouterr().out
    for option in ("--lora-rank R", "--lora-alpha", "--lora-dropout", "--lora-targets", "--merge"):
        assert option in text
