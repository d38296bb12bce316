"""Which loaded model answers a request that names none, and which ones a named model may answer.

A request asks for a request task (heads.contract.REQUEST_TASKS): /classify classification,
/embed embedding, /embed_sparse sparse-embedding, /rerank and /v1/rerank rerank, /zero-shot
zero-shot, and so on. When it names no model, the candidates are the ready models that serve it:

- rerank: classification packages that read pairs, with one label or two (a relevance score) and
  no entailment label, and late-interaction (ColBERT) packages, which score by MaxSim; zero-shot: those whose labels name entailment (NLI) and that read pairs.
  A package exported before packages said what they read ("unknown") counts only when no
  candidate says "pairs", as every classification package counted before;
- embedding / sparse-embedding: the dense / the sparse embedding packages;
- token-embedding (/embed_all): the dense embedding packages and the late-interaction ones;
- any other task: every package of it.

The setting (`--default-model TASK=NAME`, BERT_HEADS_DEFAULT_MODEL) answers whenever NAME is
loaded and can answer the task. Otherwise one candidate answers; of several, the one whose
package.json says `default_for` the task (training.export --default-for; `make models` declares
its demo packages); else a 422 lists the candidates and says how to choose.

Looked up per request, so that model control (load, reload, unload while serving) cannot leave
a stale default behind: an unloaded default falls back to the next rule. The setting is checked
at start-up (`check_defaults`): a name that no package folder has, or a package that cannot
answer the task, stops the start.

A named model that reads single texts is refused on /rerank, /v1/rerank and /zero-shot (422):
those score pairs of texts it was not trained on. The request overrides that with
`allow_single_text: true`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol, TypeVar

from heads.contract import MANIFEST, REQUEST_TASKS, answering_tasks
from heads.package import ModelPackage, PackageError, find_packages, read_package
from heads.tasks.zero_shot import is_nli
from service.errors import InputError

PAIR_TASKS = ("rerank", "zero-shot")  # what scores pairs of texts
WHAT = {  # how messages name the models of a request task
    "rerank": "rerankers (classification models of query / document pairs)",
    "zero-shot": "NLI models",
    "sparse-embedding": "sparse embedding models",
}


class Served(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def package(self) -> ModelPackage: ...


M = TypeVar("M", bound=Served)


def package_folders(model_dir: Path, model_name: str | None) -> list[tuple[Path, str]]:
    """(folder, served name) of each package: model_dir's sub-folders under their names, or
    model_dir itself when it is one package (under model_name, else its name)."""
    if (model_dir / MANIFEST).is_file():
        return [(model_dir, model_name or model_dir.resolve().name)]
    return [(p, p.name) for p in find_packages(model_dir)]


def unfit(package: ModelPackage, use: str) -> str | None:
    """Why `package` is no candidate for request task `use` (None: it is one, or, reading
    "unknown", may be)."""
    tasks = answering_tasks(use)
    if package.task not in tasks:
        return f"it is a {package.task} model, not a {' or '.join(tasks)} one"
    if package.task == "late-interaction":  # ColBERT: MaxSim rerank and token vectors
        return None
    if use == "embedding" and package.sparse:
        return "it is a sparse embedding model (/embed_sparse)"
    if use in ("sparse-embedding", "token-embedding") and package.sparse != (
        use == "sparse-embedding"
    ):
        return (
            "it is a dense embedding model (/embed)"
            if use == "sparse-embedding"
            else "it is a sparse embedding model: its vectors are per vocabulary entry, not token"
        )
    n = len(package.labels or [])
    if use == "rerank" and is_nli(package):
        return "its labels name entailment: an NLI model (/zero-shot)"
    if use == "rerank" and n not in (1, 2):
        return f"it has {n} labels, where a reranker has one relevance score (or two labels)"
    if use == "zero-shot" and not is_nli(package):
        return "its labels name no entailment: zero-shot needs an NLI model"
    if use in PAIR_TASKS and package.reads == "single":
        return "it reads single texts, and this task scores pairs"
    return None


def choose(models: Iterable[M], use: str, configured: str | None) -> M | None:
    """The model for a request of `use` that names none (the module docstring's rules); None
    when no model can answer it, InputError listing them when several can and none is the
    default."""
    fit = [m for m in models if unfit(m.package, use) is None]
    for m in fit:
        if m.name == configured:
            return m
    if use in PAIR_TASKS and any(m.package.reads == "pairs" for m in fit):
        # a ColBERT model scores a query and a document as surely as a pair reader does
        fit = [m for m in fit if m.package.reads == "pairs" or m.package.task == "late-interaction"]
    if len(fit) <= 1:
        return fit[0] if fit else None
    declared = [m for m in fit if use in m.package.default_for]
    if len(declared) == 1:
        return declared[0]
    what = WHAT.get(use, f"{use} models")
    if declared:
        raise InputError(
            f"several {what} declare themselves the default ({', '.join(m.name for m in declared)}"
            f"); name one in 'model', or choose with --default-model {use}=NAME "
            "(BERT_HEADS_DEFAULT_MODEL)"
        )
    raise InputError(
        f"several {what} are loaded ({', '.join(m.name for m in fit)}); name one in 'model', "
        f"or set a default with --default-model {use}=NAME (BERT_HEADS_DEFAULT_MODEL)"
    )


def defaults(models: list[M], configured: Mapping[str, str]) -> dict[str, str]:
    """request task -> the model a request that names none gets, where one does (GET /models)."""
    out = {}
    for use in REQUEST_TASKS:
        with contextlib.suppress(InputError):
            if (chosen := choose(models, use, configured.get(use))) is not None:
                out[use] = chosen.name
    return out


def check_named(package: ModelPackage, use: str, endpoint: str, allow_single_text: bool) -> None:
    """A model named for a pair task that reads single texts: InputError saying why and how to
    override. Another misfit (no entailment label, too many labels) is left to the task's own
    message."""
    if use not in PAIR_TASKS or package.reads != "single" or allow_single_text:
        return
    if use == "zero-shot" and not is_nli(package):
        return
    if use == "rerank" and len(package.labels or []) not in (1, 2):
        return
    raise InputError(
        f"model {package.name!r} reads single texts (its package.json says reads: single), and "
        f"{endpoint} scores pairs of texts, which it was not trained on: name a model that reads "
        "pairs (GET /models says what each reads); if this one was trained on pairs, export it "
        'again with --reads pairs; to use it as it is, send "allow_single_text": true'
    )


def none_loaded(models: list[M], use: str | None, endpoint: str) -> str:
    """What a 404 says when no model can answer `use`: why each model of its task is not one,
    and, for the pair tasks, how to get one."""
    if use is None:
        return "no model is loaded; GET /models lists what is"
    task = REQUEST_TASKS[use]
    tasks = answering_tasks(use)
    others = [(m.name, unfit(m.package, use)) for m in models if m.package.task in tasks]
    if use not in PAIR_TASKS:
        if not others:
            return f"no {task} model is loaded; GET /models lists what is"
        names = ", ".join(name for name, _ in others)
        return (
            f"no {task} model that {endpoint} serves is loaded ({names} "
            f"{'is' if len(others) == 1 else 'are'} for other endpoints: GET /models lists each "
            "model's endpoints)"
        )
    why = "; ".join(f"{name}: {reason}" for name, reason in others)
    what, demo = (
        ("no reranker is loaded", "demo-reranker")
        if use == "rerank"
        else ("no NLI model is loaded", "demo-nli")
    )
    return (
        f"{what}: {endpoint} needs a classification model that reads pairs of texts"
        + (" or a late-interaction (ColBERT) model" if use == "rerank" else "")
        + (f" ({why})" if why else "")
        + f". `make models-tasks` adds a demo one ({demo}); export your own with python -m "
        "training.export --task classification (--reads pairs when its folder does not say "
        "so); GET /models lists what is loaded"
    )


def parse_defaults(value: Any) -> Any:
    """ "TASK=NAME" items (a list, or one comma-separated string) -> {task: name}; ValueError
    naming a malformed item, an unknown task or a task given twice."""
    if isinstance(value, str):
        value = [item for item in value.split(",") if item.strip()]
    if not isinstance(value, list):
        return value  # a dict already, or pydantic says what is wrong
    out: dict[str, str] = {}
    for item in value:
        use, _, name = str(item).partition("=")
        use, name = use.strip(), name.strip()
        if not name:
            raise ValueError(f"{item!r}: give TASK=NAME, e.g. classification=demo-sentiment")
        if use not in REQUEST_TASKS:
            raise ValueError(f"{item!r}: {use!r} is not one of {', '.join(REQUEST_TASKS)}")
        if use in out:
            raise ValueError(f"{use} is given twice ({out[use]}, {name})")
        out[use] = name
    return out


def check_defaults(configured: Mapping[str, str], model_dir: Path, model_name: str | None) -> None:
    """ValueError unless each configured default names a package folder of model_dir that can
    answer its task (package.json read, files not hashed: the load does that)."""
    folders = {name: path for path, name in package_folders(model_dir, model_name)}
    for use, name in configured.items():
        if name not in folders:
            there = ", ".join(folders) or "none"
            raise ValueError(
                f"{use}={name}: no package {name!r} in {model_dir} (the packages there: {there})"
            )
        try:
            package = read_package(folders[name], verify=False)
        except PackageError as e:
            raise ValueError(f"{use}={name}: {e}") from None
        if why := unfit(package, use):
            raise ValueError(f"{use}={name}: {name} cannot answer {use} requests: {why}")


def root_task(models: list[M], configured: Mapping[str, str]) -> str:
    """The request task that `POST /` answers (huggingface_hub's InferenceClient posts there,
    as to text-embeddings-inference's root): the only model's task, or, with several, the one
    task that --default-model names; InputError otherwise, saying how to choose."""
    tasks = {"sparse-embedding" if m.package.sparse else m.package.task: m.name for m in models}
    if len(models) == 1:
        [use] = tasks
        return use
    if len(configured) == 1:
        [use] = configured
        return use
    raise InputError(
        "POST / answers for the only model, or the one task --default-model names "
        f"(BERT_HEADS_DEFAULT_MODEL); {len(models)} models are loaded "
        f"({', '.join(m.name for m in models)}): post to the task's route instead "
        "(/classify, /ner, /qa, /zero-shot, /fill-mask, /embed, /similarity)"
    )
