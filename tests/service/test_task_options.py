"""The request bodies and the tasks' typed options (heads.tasks) declare each option once: a
body's field of an option's name has that option's default, and `options()` carries what a
client sent to the engine unchanged; v2's parameters are body fields that are options."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from pydantic_core import PydanticUndefined

from heads.tasks import TaskOptions, classify, qa, rerank, zero_shot
from service import schemas
from service.routes import v2

BODIES = [
    cls
    for cls in vars(schemas).values()
    if isinstance(cls, type) and issubclass(cls, schemas.TaskBody) and cls is not schemas.TaskBody
]


def test_every_tasks_options_have_a_body() -> None:
    assert {body.OPTIONS for body in BODIES} == set(TaskOptions.__subclasses__())


@pytest.mark.parametrize("body", BODIES, ids=lambda b: b.__name__)
def test_a_body_field_of_an_options_name_has_its_default(body: type[schemas.TaskBody]) -> None:
    shared = [f for f in dataclasses.fields(body.OPTIONS) if f.name in body.model_fields]
    assert shared, f"{body.__name__} has none of {body.OPTIONS.__qualname__}'s fields"
    for option in shared:
        field = body.model_fields[option.name]
        theirs = field.default if field.default is not PydanticUndefined else dataclasses.MISSING
        assert theirs == option.default, (body.__name__, option.name)


def test_options_carry_what_the_client_sent() -> None:
    body = schemas.ClassifyRequest.model_validate(
        {"inputs": "x", "parameters": {"top_k": 3, "function_to_apply": "sigmoid"}}
    )
    assert body.options() == classify.Options(top_k=3, function_to_apply="sigmoid")
    assert body.options(top_k=None).top_k is None  # an endpoint's own setting wins
    asked = schemas.QaRequest.model_validate(
        {"question": "q", "context": "c", "max_seq_len": 64, "doc_stride": 16}
    )
    assert asked.options() == qa.Options(max_seq_len=64, doc_stride=16)
    rank = schemas.CohereRerankRequest.model_validate(
        {"query": "q", "documents": ["a"], "top_n": 1, "max_tokens_per_doc": 9}
    )
    assert rank.options() == rerank.Options(query="q", top_n=1, max_tokens_per_doc=9)


@pytest.mark.parametrize(
    ("labels", "want"), [("a, b ,,c", ["a", "b", "c"]), (["x", "y z"], ["x", "y z"])]
)
def test_zero_shot_labels_are_a_list_either_way(labels: Any, want: list[str]) -> None:
    body = schemas.ZeroShotRequest.model_validate({"inputs": "t", "candidate_labels": labels})
    options = body.options()
    assert isinstance(options, zero_shot.Options) and options.labels == want
    assert options.sized(["t"]) == {"inputs": ["t"], "candidate_labels": want}


def test_v2_parameters_are_options_of_its_schema() -> None:
    for task in [*v2.TASKS.values(), v2.SPARSE]:
        names = {f.name for f in dataclasses.fields(task.schema.OPTIONS)}
        assert set(task.parameters) <= names & set(task.schema.model_fields), task
