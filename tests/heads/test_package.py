"""The package format: what write_package writes, read_package reads back, and every way a
damaged package is refused with the file and the reason named. No torch, no ONNX: the files
are stand-in bytes, since read_package checks presence and hashes, not graph contents."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from heads.package import (
    FORMAT_VERSION,
    ModelPackage,
    PackageError,
    find_packages,
    read_package,
    write_package,
)


def manifest(**changes: object) -> dict:
    m = {
        "name": "sst2",
        "task": "classification",
        "labels": ["negative", "positive"],
        "problem_type": "single_label",
        "pooling": None,
        "normalize": False,
        "max_seq_length": 128,
        "do_lower_case": True,
        "inputs": [
            {"name": n, "dtype": "int64", "shape": ["batch", "sequence"]}
            for n in ("input_ids", "attention_mask", "token_type_ids")
        ],
        "outputs": [{"name": "logits", "dtype": "float32", "shape": ["batch", 2]}],
        "variants": {"fp32": "model.onnx", "int8": "model.int8.onnx"},
        "prefer": {"cpu": "fp32", "gpu": "fp32"},
        "parity": {"fp32": {"max_abs_diff": {"logits": 1e-6}}},
        "source": {"checkpoint": "runs/sst2"},
    }
    m.update(changes)
    return m


@pytest.fixture
def package(tmp_path: Path) -> Path:
    out = tmp_path / "sst2"
    out.mkdir()
    (out / "model.onnx").write_bytes(b"\x08\x07fp32 graph" * 1000)
    (out / "model.int8.onnx").write_bytes(b"\x08\x07int8 graph")
    (out / "tokenizer.json").write_text('{"version": "1.0"}')
    write_package(out, manifest())
    return out


def edit_manifest(path: Path, **changes: object) -> None:
    m = json.loads((path / "package.json").read_text())
    m.update(changes)
    for key in [k for k, v in changes.items() if v is ...]:
        del m[key]
    (path / "package.json").write_text(json.dumps(m))


def test_round_trip(package: Path) -> None:
    pkg = read_package(package)
    assert isinstance(pkg, ModelPackage)
    assert (pkg.path, pkg.name, pkg.task) == (package, "sst2", "classification")
    assert pkg.labels == ["negative", "positive"] and pkg.problem_type == "single_label"
    assert pkg.variant_path("int8") == package / "model.int8.onnx"
    assert pkg.tokenizer_path == package / "tokenizer.json"
    assert set(pkg.sha256) == {"model.onnx", "model.int8.onnx", "tokenizer.json"}
    assert [i["name"] for i in pkg.inputs] == ["input_ids", "attention_mask", "token_type_ids"]
    assert pkg.parity["fp32"]["max_abs_diff"]["logits"] == 1e-6
    written = json.loads((package / "package.json").read_text())
    assert written["format"] == FORMAT_VERSION
    assert list(written) == sorted(written)  # sorted keys: diffs between exports stay small


def test_one_changed_byte_is_refused(package: Path) -> None:
    data = bytearray((package / "model.onnx").read_bytes())
    data[len(data) // 2] ^= 0x01
    (package / "model.onnx").write_bytes(bytes(data))
    with pytest.raises(
        PackageError, match=r"model\.onnx: sha256 mismatch \(truncated or modified\?\)"
    ):
        read_package(package)
    read_package(package, verify=False)  # hashing can be skipped, on purpose only


def test_truncated_variant_is_refused(package: Path) -> None:
    (package / "model.int8.onnx").write_bytes(b"\x08")
    with pytest.raises(PackageError, match=r"model\.int8\.onnx: sha256 mismatch"):
        read_package(package)


def test_missing_tokenizer_is_refused_even_without_verify(package: Path) -> None:
    (package / "tokenizer.json").unlink()
    with pytest.raises(PackageError, match=r"tokenizer\.json: file is missing"):
        read_package(package, verify=False)


def test_unknown_format_is_refused(package: Path) -> None:
    edit_manifest(package, format=7)
    with pytest.raises(
        PackageError,
        match=r"package\.json: format 7 is not supported \(this service reads format 1\)",
    ):
        read_package(package)


@pytest.mark.parametrize("field", ["task", "variants", "sha256", "max_seq_length"])
def test_missing_field_is_refused(package: Path, field: str) -> None:
    edit_manifest(package, **{field: ...})
    with pytest.raises(PackageError, match=rf"package\.json: missing field\(s\) {field}"):
        read_package(package)


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"task": "summarization"}, "task 'summarization' is not one of"),
        ({"labels": None}, "needs 'labels'"),
        ({"problem_type": "softmax"}, "problem_type 'softmax' is not one of"),
        ({"variants": {"fp64": "model.onnx"}}, "variants .* must map"),
        ({"prefer": {"cpu": "fp16"}}, r"prefer\['cpu'\] is 'fp16'"),
        ({"max_seq_length": 0}, "max_seq_length 0"),
        ({"prefer": "fp32"}, "prefer must be an object"),
        ({"outputs": "logits"}, "outputs must be a list"),
        (
            {
                "parity": {
                    "int8": {
                        "agreement": {
                            "metrics": {"top1_agreement": "high"},
                            "gate": {},
                            "passed": True,
                        }
                    }
                }
            },
            r"parity\.int8\.agreement must hold numeric metrics",
        ),
        (
            {"parity": {"int8": {"agreement": {"metrics": {}, "gate": {}}}}},
            r"parity\.int8\.agreement must hold .* a passed flag",
        ),
    ],  # fmt: skip
)
def test_inconsistent_manifest_is_refused(package: Path, changes: dict, reason: str) -> None:
    edit_manifest(package, **changes)
    with pytest.raises(PackageError, match=reason):
        read_package(package)


def test_sha256_entries_cannot_point_outside(package: Path) -> None:
    m = json.loads((package / "package.json").read_text())
    m["sha256"]["../secrets"] = "0" * 64
    (package / "package.json").write_text(json.dumps(m))
    with pytest.raises(PackageError, match="outside the package"):
        read_package(package)


def test_not_json_and_no_package(tmp_path: Path, package: Path) -> None:
    with pytest.raises(PackageError, match="no such file"):
        read_package(tmp_path / "nothing")
    (package / "package.json").write_text("{not json")
    with pytest.raises(PackageError, match="package.json: not valid JSON"):
        read_package(package)


def test_unknown_variant_names_what_exists(package: Path) -> None:
    with pytest.raises(PackageError, match="no 'fp16' variant .*has fp32, int8"):
        read_package(package).variant_path("fp16")


def test_embedding_package_needs_pooling(tmp_path: Path) -> None:
    out = tmp_path / "minilm"
    out.mkdir()
    (out / "model.onnx").write_bytes(b"graph")
    (out / "tokenizer.json").write_text("{}")
    outputs = [{"name": "embeddings", "dtype": "float32", "shape": ["batch", 384]}]
    embedding = manifest(
        task="embedding",
        labels=None,
        problem_type=None,
        outputs=outputs,
        variants={"fp32": "model.onnx"},
        normalize=True,
    )
    with pytest.raises(PackageError, match="pooling None is not one of mean, cls"):
        write_package(out, embedding)
    pkg = write_package(out, {**embedding, "pooling": "mean"})
    assert (pkg.pooling, pkg.normalize, pkg.labels, pkg.problem_type) == ("mean", True, None, None)


def test_a_variants_agreement_with_fp32_is_read_back(package: Path) -> None:
    record = {"kind": "classification", "metrics": {"top1_agreement": 1.0},
              "gate": {"top1_agreement": 0.99}, "passed": True, "sample": {"inputs": 238}}  # fmt: skip
    edit_manifest(package, parity={"fp32": {}, "int8": {"max_abs_diff": {}, "agreement": record}})
    pkg = read_package(package)
    assert pkg.agreement("int8") == record
    assert pkg.agreement("fp32") is None and pkg.agreement("fp16") is None


def test_find_packages(tmp_path: Path, package: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes.txt").write_text("not a package")
    (tmp_path / "a-first").mkdir()
    (tmp_path / "a-first" / "package.json").write_text("{}")
    assert find_packages(tmp_path) == [tmp_path / "a-first", package]
    assert find_packages(tmp_path / "absent") == []


def test_reads_and_default_for_are_read_back_and_checked(package: Path) -> None:
    """`reads`: what a classifier reads ("unknown" before the export recorded it);
    `default_for`: the request tasks it answers when a request names no model."""
    assert (read_package(package).reads, read_package(package).default_for) == ("unknown", ())
    edit_manifest(package, reads="pairs", default_for=["classification", "rerank"])
    pkg = read_package(package, verify=False)
    assert (pkg.reads, pkg.default_for) == ("pairs", ("classification", "rerank"))
    for changes, reason in [
        ({"reads": "triples"}, "reads 'triples': a classification package reads one of"),
        ({"default_for": ["embedding"]}, "'embedding', which a classification package does"),
        ({"default_for": "rerank"}, "default_for must be a list"),
        ({"reads": "single", "default_for": ["zero-shot"]}, "scores pairs, but the package"),
    ]:
        edit_manifest(package, **changes)
        with pytest.raises(PackageError, match=reason):
            read_package(package, verify=False)
        edit_manifest(package, reads="pairs", default_for=[])
