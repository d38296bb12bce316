"""Request and response bodies (the names follow Hugging Face pipelines and TEI).

The shape rule, for every endpoint: a single input (a string, one pair, one question/context)
gets the answer for that input; a list gets a list of answers in input order, also a list of
one. Two exceptions, for compatibility: /embed always answers a list of vectors (as TEI does),
/v1/embeddings the OpenAI envelope. And /qa answers a list of spans per input when top_k > 1.

Texts:
- any Unicode string, control characters included (the tokenizer drops them; NER offsets still
  index the original text). The empty or whitespace-only text is served as the empty sequence
  `[CLS] [SEP]` (no entities for NER), as the pipelines do; but an empty or whitespace-only QA
  `question` or `context` is a 422, as the pipeline refuses both (heads.tasks.qa);
- a lone UTF-16 surrogate (JSON "\\ud800" without its pair) is not Unicode text: 422;
- a non-string where a text belongs, or an empty list: 422;
- more inputs than max_client_batch_size, or a text longer than max_text_chars: 413, like any
  other request too large to serve (the client should split it).
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    GetJsonSchemaHandler,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    model_validator,
)
from pydantic.json_schema import JsonDict, JsonSchemaValue
from pydantic_core import CoreSchema, PydanticCustomError

from heads.tasks import (
    TaskOptions,
    classify,
    embed,
    embed_all,
    fill_mask,
    ner,
    qa,
    rerank,
    sparse,
    tokenize,
    zero_shot,
)


def _check_unicode(text: str, where: str = "text") -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise PydanticCustomError(
            "unicode",
            "{where} contains a lone UTF-16 surrogate at character {at}; send valid Unicode",
            {"where": where, "at": e.start},
        ) from None
    return text


def _type_name(value: object) -> str:
    return {
        dict: "an object",
        list: "a list",
        type(None): "null",
        bool: "a boolean",
        str: "a string",
    }.get(type(value), "a number" if isinstance(value, int | float) else type(value).__name__)


def _texts(allow_pairs: bool) -> WrapValidator:
    """A string or a non-empty list of strings (or [a, b] pairs), with messages that name the
    bad item instead of pydantic's one line per union member."""
    want = "a string or an [a, b] pair of strings" if allow_pairs else "a string"

    def validate(value: Any, _: ValidatorFunctionWrapHandler) -> Any:
        if isinstance(value, str):
            return _check_unicode(value, "the input")
        if not isinstance(value, list):
            raise PydanticCustomError(
                "texts",
                "expected {want} or a list of them, got {got}",
                {"want": want, "got": _type_name(value)},
            )
        if not value:
            raise PydanticCustomError("texts", "the list is empty; send at least one input", {})
        out: list[str | tuple[str, str]] = []
        for i, item in enumerate(value):
            where = f"item {i}"
            if isinstance(item, str):
                out.append(_check_unicode(item, where))
            elif (
                allow_pairs
                and isinstance(item, list)
                and len(item) == 2
                and all(isinstance(s, str) for s in item)
            ):
                out.append((_check_unicode(item[0], where), _check_unicode(item[1], where)))
            else:
                raise PydanticCustomError(
                    "texts",
                    "item {i} must be {want}, got {got}",
                    {"i": i, "want": want, "got": _type_name(item)},
                )
        return out

    return WrapValidator(validate)


# Bounds on token counts: far above any model window, low enough that no arithmetic overflows.
MAX_TOKENS = 100_000


def _integral(value: Any) -> Any:
    return int(value) if isinstance(value, float) and value.is_integer() else value


# An integer field: 3, or 3.0 (JSON has one number type, and JSON Schema's "integer" takes 3.0,
# so a client or generator that writes 3.0 means 3); never 3.5, "3" or true (strict otherwise).
# Bounds of an optional one go before it, `Annotated[int, Field(ge=1), INTEGRAL] | None`: put
# on the field, pydantic enforces them but writes "ge" into the schema, not "minimum".
INTEGRAL = BeforeValidator(_integral)
JsonInt = Annotated[int, INTEGRAL]

Text = Annotated[str, AfterValidator(_check_unicode)]
# min_length only documents the rule in the OpenAPI schema; _texts enforces it (with its message).
Texts = Annotated[str | Annotated[list[str], Field(min_length=1)], _texts(allow_pairs=False)]
TextsOrPairs = Annotated[
    str | Annotated[list[str | tuple[str, str]], Field(min_length=1)], _texts(allow_pairs=True)
]
ModelName = Annotated[
    str | None,
    Field(description="Which loaded package to use; optional when only one serves the task."),
]


AllowSingleText = Annotated[
    bool,
    Field(
        description="Use a named model that reads single texts (package.json reads: single) "
        "to score pairs anyway; without it such a model is refused (422), as it was not "
        "trained on pairs.",
    ),
]


PromptName = Annotated[
    str | None,
    Field(
        description="Embedding: one of the model's prompts (its sentence-transformers "
        "`prompts`, e.g. 'query'), whose text goes before each input, as "
        "SentenceTransformer.encode(prompt_name=...) does. Default: the model's "
        "default_prompt_name, if any, else no prompt.",
    ),
]


TruncationDirection = Annotated[
    Literal["right", "left", "Right", "Left"],
    AfterValidator(str.lower),  # the engine and heads.rows take "right" / "left"
    Field(
        description="Which end of a too-long input truncation cuts: right keeps the first "
        "tokens, left the last (TEI's Right / Left are accepted too).",
    ),
]


class TaskBody(BaseModel):
    """The body of a request for one task: `options()` are its task's options (OPTIONS, a
    heads.tasks Options type) read from its fields of the same names; an option the body has
    no field for keeps its default. The engine takes them as they are."""

    OPTIONS: ClassVar[type[TaskOptions]]
    # its fields that are options, in the body's order, found once per body class:
    # dataclasses.fields() on every request cost ~10 us of the event loop's time
    option_fields: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        if "OPTIONS" in cls.__dict__:
            names = {f.name for f in dataclasses.fields(cls.OPTIONS)}
            cls.option_fields = tuple(n for n in cls.model_fields if n in names)

    def options(self, **fixed: Any) -> Any:
        """The task options this body gives; `fixed`: the ones its endpoint sets itself."""
        given = {name: getattr(self, name) for name in self.option_fields}
        return self.OPTIONS(**{**given, **fixed})


class _Body(BaseModel):
    # extra="forbid": a misspelt option is an error, not a default. strict: JSON types as the
    # schema says (no "3" for 3, no 0 for false), so a client's type mistake is not guessed at.
    model_config = ConfigDict(extra="forbid", strict=True)


class _HfBody(_Body):
    """A task body that also takes the Hugging Face Inference API's form, `{"inputs": ...,
    "parameters": {...}}`, as huggingface_hub's InferenceClient sends it: each parameter is
    moved to the route's own field of that name (one the route does not have is refused by
    name, as is one given twice). `parameters` present, even empty, asks for the answer in the
    shape the client parses (the route's docstring says which); without it, the native one."""

    parameters: dict[str, Any] | None = Field(
        default=None,
        description="The Hugging Face Inference API form: this route's options by name; "
        "its presence asks for the answer in the shape huggingface_hub's InferenceClient "
        "parses.",
    )

    @model_validator(mode="before")
    @classmethod
    def _flatten_parameters(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not isinstance(data.get("parameters"), dict):
            return data
        own = cls._own_options()
        out = {**data, "parameters": {}}
        for key, value in data["parameters"].items():
            if key not in own:
                raise PydanticCustomError(
                    "hf_parameter",
                    "parameters.{key}: not a parameter of this route (it takes {own})",
                    {"key": key, "own": ", ".join(own)},
                )
            if key in data:
                raise PydanticCustomError(
                    "hf_parameter",
                    "{key} is given twice, in the body and in parameters; send it once",
                    {"key": key},
                )
            out[key] = value
        return out

    @classmethod
    def _own_options(cls) -> list[str]:
        return sorted(set(cls.model_fields) - {"inputs", "parameters", "model"})

    @classmethod
    def __get_pydantic_json_schema__(
        cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        # The document states what `parameters` takes, the route's own options and nothing else,
        # as the validator above refuses any other key
        schema = handler(core_schema)
        body = handler.resolve_ref_schema(schema)
        props = body.get("properties", {})
        own = {k: props[k] for k in cls._own_options() if k in props}
        if "parameters" in props:
            props["parameters"] = {
                "anyOf": [
                    {"type": "object", "properties": own, "additionalProperties": False},
                    {"type": "null"},
                ],
                "default": None,
                "description": props["parameters"].get("description", ""),
            }
        return schema


# -- requests ----------------------------------------------------------------------------------


class ClassifyRequest(_HfBody, TaskBody):
    OPTIONS = classify.Options

    inputs: TextsOrPairs = Field(description="A text, a list of texts, or [a, b] pairs (NLI).")
    top_k: Annotated[int, Field(ge=1, le=10_000), INTEGRAL] | None = Field(
        default=1, description="Labels per input, best first; null = all."
    )
    function_to_apply: Literal["softmax", "sigmoid", "none"] | None = Field(
        default=None, description="Default by the package's problem type: softmax, sigmoid or none."
    )
    truncate: bool = Field(
        default=True, description="Cut inputs to the model window; false = 422 instead."
    )
    truncation_direction: TruncationDirection = "right"
    model: ModelName = None


class NerRequest(_HfBody, TaskBody):
    OPTIONS = ner.Options

    inputs: Texts
    aggregation_strategy: Literal["none", "simple", "first", "average", "max"] = "simple"
    ignore_labels: list[Text] | None = Field(
        default=None, description='Labels to leave out; default ["O"].'
    )
    stride: Annotated[int, Field(ge=0, le=MAX_TOKENS), INTEGRAL] | None = Field(
        default=None,
        description="Tokens shared by consecutive windows of a long text; default a quarter "
        "of the window.",
    )
    model: ModelName = None


# A QA text has a token to read: the schema says so (a character that is neither a space nor
# a control character); heads.tasks.qa refuses one with no token (the model's tokenizer decides).
QA_TEXT: JsonDict = {"minLength": 1, "pattern": "[^\\s\\x00-\\x1f\\x7f-\\x9f]"}
QaText = Annotated[Text, Field(json_schema_extra=QA_TEXT)]


class QaInput(_Body):
    question: QaText
    context: QaText


_STRING: JsonDict = {"type": "string"}
_NULL: JsonDict = {"type": "null"}
# The two forms, for the OpenAPI schema (the validators below enforce them): a generated client
# or fuzzer then knows that {} or both forms at once are not a request.
_QA_FORMS: JsonDict = {
    "oneOf": [
        {
            "required": ["question", "context"],
            "properties": {"question": _STRING, "context": _STRING, "inputs": _NULL},
        },
        {
            "required": ["inputs"],
            "properties": {
                "inputs": {"type": "array", "minItems": 1},
                "question": _NULL,
                "context": _NULL,
            },
        },
    ]
}


class QaRequest(_HfBody, TaskBody):
    OPTIONS = qa.Options

    model_config = ConfigDict(json_schema_extra=_QA_FORMS)

    question: QaText | None = None
    context: QaText | None = None
    inputs: list[QaInput] | None = Field(
        default=None,
        description="Instead of question/context: a list of them (or one {question, context} "
        "object, the Hugging Face Inference API form, answered like question/context).",
    )
    top_k: JsonInt = Field(
        default=1, ge=1, le=100, description="Answers per input; > 1 answers a list."
    )
    max_answer_len: JsonInt = Field(
        default=15, ge=1, le=MAX_TOKENS, description="Longest answer in tokens."
    )
    doc_stride: Annotated[int, Field(ge=0, le=MAX_TOKENS), INTEGRAL] | None = Field(
        default=None,
        description="Tokens shared by consecutive context windows; default "
        "min(128, max_seq_len / 2).",
    )
    max_seq_len: JsonInt = Field(
        default=384,
        ge=4,
        le=MAX_TOKENS,
        description="Window length in tokens, capped by the model's.",
    )
    handle_impossible_answer: bool = Field(
        default=False, description="Allow the empty answer (SQuAD 2.0)."
    )
    model: ModelName = None

    @model_validator(mode="before")
    @classmethod
    def _single_inputs(cls, data: Any) -> Any:
        # {"inputs": {"question", "context"}} (the HF Inference API form) is the single form
        if isinstance(data, dict) and isinstance(data.get("inputs"), dict):
            data = {**data, **data["inputs"]}
            del data["inputs"]
        return data

    @model_validator(mode="after")
    def _one_form(self) -> QaRequest:
        pair = self.question is not None or self.context is not None
        if pair == (self.inputs is not None):
            raise ValueError("send either 'question' and 'context', or 'inputs', not both")
        if pair and (self.question is None or self.context is None):
            raise ValueError("'question' and 'context' go together")
        if isinstance(self.inputs, list) and not self.inputs:
            raise ValueError("'inputs' is empty; send at least one {question, context}")
        return self


EmbedWindows = Annotated[
    bool,
    Field(
        description="Embed an input longer than the model's window by overlapping windows, "
        "pooled into one vector. Each window is a full row that starts with the prompt, "
        "consecutive windows share an eighth of their text tokens, and the vector is the mean "
        "of the windows' vectors weighted by the text tokens each holds, then cut to "
        "`dimensions` and normalised. An input that fits gets the same vector as without it; "
        "`truncate` and `truncation_direction` then have no effect. Usage tokens count every "
        "window's. Default off: inputs over the window are truncated (or refused).",
    ),
]


class EmbedRequest(_Body, TaskBody):
    OPTIONS = embed.Options

    inputs: Texts
    normalize: bool | None = Field(
        default=None, description="L2-normalise; default the package's choice (true)."
    )
    layers: Annotated[list[JsonInt], Field(min_length=1, max_length=256)] | None = Field(
        default=None,
        description="Hidden states to read, -1 the last layer, 0 the embeddings output "
        "(e.g. [-1, -2, -3, -4]); needs a package exported with --hidden-states. "
        "Default: the package's embedding.",
    )
    pooling: Literal["cls", "mean"] | None = Field(
        default=None,
        description="Pool tokens by [CLS] or by mask-aware mean; default the package's. "
        "Another than the package's needs --hidden-states.",
    )
    combine: Literal["concat", "sum", "mean"] = Field(
        default="concat", description="How several layers make one vector (concat: k x H)."
    )
    truncate: bool = Field(
        default=True,
        description="Cut inputs to the model window; false = 422 instead. No effect with windows.",
    )
    truncation_direction: TruncationDirection = "right"
    dimensions: Annotated[int, Field(ge=1, le=MAX_TOKENS), INTEGRAL] | None = Field(
        default=None,
        description="Keep the first D values of each vector (Matryoshka), normalised after "
        "the cut when the vectors are normalised; at most the model's size.",
    )
    prompt_name: PromptName = None
    windows: EmbedWindows = False
    model: ModelName = None


class SparseEmbedRequest(_Body, TaskBody):
    OPTIONS = sparse.Options

    inputs: Texts
    truncate: bool = Field(
        default=True, description="Cut inputs to the model window; false = 422 instead."
    )
    truncation_direction: TruncationDirection = "right"
    return_tokens: bool = Field(
        default=False, description="Name each entry's vocabulary token too."
    )
    prompt_name: PromptName = None
    model: ModelName = None


class EmbedAllRequest(_Body, TaskBody):
    """text-embeddings-inference's /embed_all: every token's vector."""

    OPTIONS = embed_all.Options

    inputs: Texts
    normalize: bool | None = Field(
        default=None,
        description="L2-normalise each vector; default: raw for an embedding model (TEI's "
        "answer), unit length for a late-interaction (ColBERT) one (what MaxSim reads).",
    )
    return_tokens: bool = Field(
        default=False,
        description="Answer {embeddings, tokens} per input: each vector's token (id, text, "
        "special, start / stop character offsets into the input).",
    )
    is_query: bool = Field(
        default=False,
        description="Late-interaction models: encode as a query (its marker, expanded with "
        "[MASK] to the query length) rather than a document (PyLate's is_query).",
    )
    truncate: bool = Field(
        default=True, description="Cut inputs to the model window; false = 422 instead."
    )
    truncation_direction: TruncationDirection = "right"
    prompt_name: PromptName = None
    model: ModelName = None


class SparseValue(BaseModel):
    index: int
    value: float
    token: str | None = None


# The schema states these; the task refuses them with its own message (one place for the rule).
NonEmptyText = Annotated[Text, Field(json_schema_extra={"minLength": 1})]
LabelList = Annotated[Text, Field(json_schema_extra={"pattern": "[^,\\s]"})]  # a label in it


class FillMaskRequest(_HfBody, TaskBody):
    OPTIONS = fill_mask.Options

    inputs: Texts = Field(description="Texts with the model's mask token ([MASK], <mask>).")
    top_k: JsonInt = Field(default=5, ge=1, le=1000, description="Fillers per mask, best first.")
    targets: NonEmptyText | Annotated[list[Text], Field(min_length=1)] | None = Field(
        default=None,
        description="Score only these words (a word that is several tokens: its first token).",
    )
    model: ModelName = None


class Filler(BaseModel):
    score: float
    token: int
    token_str: str
    sequence: str


class ZeroShotRequest(_HfBody, TaskBody):
    OPTIONS = zero_shot.Options

    inputs: Texts
    candidate_labels: LabelList | Annotated[list[Text], Field(min_length=1)] = Field(
        description="The labels to choose from: a list, or one comma-separated string."
    )
    hypothesis_template: Text = Field(
        default="This example is {}.", description="The hypothesis; {} is where a label goes."
    )
    multi_label: bool = Field(
        default=False,
        description="Score each label on its own (entailment vs contradiction) instead of "
        "softmaxing the labels against each other.",
    )
    model: ModelName = None
    allow_single_text: AllowSingleText = False


class ZeroShotAnswer(BaseModel):
    sequence: str
    labels: list[str]
    scores: list[float]


MaxTokensPerDoc = Annotated[
    Annotated[int, Field(ge=1, le=MAX_TOKENS), INTEGRAL] | None,
    Field(
        description="Read each document's first N tokens only (Cohere's and Jina's; Cohere's "
        "default: 4096); what remains past the model's window is scored by windows, best "
        "window wins.",
    ),
]
MaxTokensPerQuery = Annotated[
    Annotated[int, Field(ge=1, le=MAX_TOKENS), INTEGRAL] | None,
    Field(
        description="Read the query's first N tokens only (vLLM's, beside max_tokens_per_doc): "
        "the rest of the window goes to the document.",
    ),
]


class RerankRequest(_Body, TaskBody):
    OPTIONS = rerank.Options

    query: Text
    texts: Annotated[list[Text], Field(min_length=1)] = Field(description="The documents.")
    truncate: bool = Field(
        default=False,
        description="Cut each (query, document) pair to the model window, as the peers do. "
        "Default: a document that does not fit is scored by windows of it, its best window "
        "counting (the answer names it).",
    )
    truncation_direction: TruncationDirection = "right"
    raw_scores: bool = Field(
        default=False, description="The relevance logit instead of its sigmoid / softmax."
    )
    return_text: bool = Field(default=False, description="Put each document's text in.")
    max_tokens_per_query: MaxTokensPerQuery = None
    model: ModelName = None
    allow_single_text: AllowSingleText = False


class RerankDocument(_Body):
    text: Text


class OpenRerankRequest(TaskBody):
    OPTIONS = rerank.Options

    # Cohere / Jina / infinity clients send fields we have no use for
    model_config = ConfigDict(extra="ignore", strict=True)
    query: Text
    documents: Annotated[list[Text | RerankDocument], Field(min_length=1)]
    top_n: Annotated[int, Field(ge=1), INTEGRAL] | None = Field(
        default=None, description="The best N; default all."
    )
    return_documents: bool = False
    max_tokens_per_doc: MaxTokensPerDoc = None
    max_tokens_per_query: MaxTokensPerQuery = None
    model: ModelName = None
    allow_single_text: AllowSingleText = False


class CohereRerankRequest(TaskBody):
    """Cohere's v2 rerank request (ClientV2.rerank): documents are strings, `model` is
    required by Cohere's API but optional here (the default reranker answers)."""

    OPTIONS = rerank.Options

    model_config = ConfigDict(extra="ignore", strict=True)
    query: Text
    documents: Annotated[list[Text], Field(min_length=1)]
    top_n: Annotated[int, Field(ge=1), INTEGRAL] | None = Field(
        default=None, description="The best N; default all."
    )
    max_tokens_per_doc: MaxTokensPerDoc = None
    max_tokens_per_query: MaxTokensPerQuery = None
    model: ModelName = None
    allow_single_text: AllowSingleText = False


class SimilarityInputs(_Body):
    source_sentence: Text
    sentences: Annotated[list[Text], Field(min_length=1)]


class SimilarityParameters(_Body, TaskBody):
    OPTIONS = embed.Options

    truncate: bool = Field(default=True, description="Cut texts longer than the window.")
    truncation_direction: TruncationDirection = "right"
    prompt_name: PromptName = None


class SimilarityRequest(_Body):
    """text-embeddings-inference's /similarity (huggingface_hub's sentence_similarity)."""

    inputs: SimilarityInputs
    parameters: SimilarityParameters | None = None
    model: ModelName = None


class TokenizeRequest(_Body, TaskBody):
    OPTIONS = tokenize.TokenizeOptions

    inputs: Texts
    add_special_tokens: bool = Field(
        default=True, description="Put the model's special tokens ([CLS] ... [SEP]) around."
    )
    prompt_name: PromptName = None
    model: ModelName = None


TokenIds = Annotated[
    list[Annotated[int, Field(ge=0), INTEGRAL]], Field(min_length=0, max_length=MAX_TOKENS)
]


def _check_token_ids(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    """A list of token ids or a list of such lists, with a message that names the bad item
    and what a token id is, instead of pydantic's one line per union member."""
    if not isinstance(value, list):
        raise PydanticCustomError(
            "ids", "expected a list of token ids or a list of such lists, got {got}",
            {"got": _type_name(value)},
        )  # fmt: skip
    rows = value if value and all(isinstance(x, list) for x in value) else [value]
    nested = rows is value
    for i, row in enumerate(rows):
        if len(row) > MAX_TOKENS:
            raise PydanticCustomError(
                "ids", "{where} holds {n} ids, more than {most}",
                {"where": f"item {i}" if nested else "the list", "n": len(row), "most": MAX_TOKENS},
            )  # fmt: skip
        for j, x in enumerate(row):
            if isinstance(x, bool) or not isinstance(_integral(x), int) or x < 0:
                where = f"item [{i}][{j}]" if nested else f"item {j}"
                raise PydanticCustomError(
                    "ids", "{where} is {got}: a token id is an integer of at least 0",
                    {"where": where, "got": repr(x) if isinstance(x, int) else _type_name(x)},
                )  # fmt: skip
    return handler(value)


class DecodeRequest(_Body, TaskBody):
    OPTIONS = tokenize.DecodeOptions

    ids: Annotated[
        TokenIds | Annotated[list[TokenIds], Field(min_length=1)], WrapValidator(_check_token_ids)
    ] = Field(description="Token ids, or a list of id lists.")
    skip_special_tokens: bool = Field(default=True, description="Leave out [CLS], [PAD]...")
    model: ModelName = None


TOKEN_ID_INPUT = (
    "input holds token ids: send the texts themselves (this server tokenizes with the model's "
    "own tokenizer). LangChain's OpenAIEmbeddings sends ids unless created with "
    "check_embedding_ctx_length=False"
)


def _no_token_ids(value: Any) -> Any:
    """Token-id input (OpenAI's list of ints, or of int lists) refused with what to change:
    ids counted by another tokenizer (tiktoken's, LangChain's default) mean nothing here."""
    if isinstance(value, list) and value:
        first = value[0]
        if (isinstance(first, int) and not isinstance(first, bool)) or (
            isinstance(first, list) and first and isinstance(first[0], int)
        ):
            raise PydanticCustomError("token_ids", TOKEN_ID_INPUT, {})
    return value


class OpenAIEmbeddingRequest(TaskBody):
    OPTIONS = embed.Options

    # OpenAI clients send fields we have no use for
    model_config = ConfigDict(extra="ignore", strict=True)
    input: Annotated[Texts, BeforeValidator(_no_token_ids)]
    model: ModelName = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Field(ge=1, le=MAX_TOKENS), INTEGRAL] | None = Field(
        default=None,
        description="Keep the first D values of each vector (Matryoshka), normalised after "
        "the cut; at most the model's size.",
    )
    user: str | None = None
    prompt_name: PromptName = None
    windows: EmbedWindows = False


# -- responses (for the OpenAPI page; routes return them as plain JSON) -------------------------


class Error(BaseModel):
    error: str
    error_type: str


class LabelScore(BaseModel):
    label: str
    score: float


class Entity(BaseModel):
    entity_group: str | None = None
    entity: str | None = None  # aggregation_strategy "none"
    index: int | None = None  # aggregation_strategy "none"
    score: float
    word: str
    start: int
    end: int


class Answer(BaseModel):
    answer: str
    score: float
    start: int
    end: int


class OpenAIEmbedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class Span(BaseModel):
    start: int
    end: int


class Rank(BaseModel):
    index: int
    score: float
    text: str | None = None
    window: Span | None = Field(
        default=None,
        description="When the document was scored by windows: the best one's character span.",
    )


class RerankResult(BaseModel):
    index: int
    relevance_score: float
    document: RerankDocument | None = None
    window: Span | None = None


class RerankUsage(BaseModel):
    total_tokens: int


class OpenRerankResponse(BaseModel):
    results: list[RerankResult]
    model: str
    usage: RerankUsage


class SimpleToken(BaseModel):
    id: int
    text: str = Field(description="The input's characters [start, stop), or a special token.")
    special: bool
    start: int | None = Field(description="Character offset into the input; null if special.")
    stop: int | None


class Usage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class OpenAIModel(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(description="When it was loaded (Unix time).")
    owned_by: str


class OpenAIModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[OpenAIModel]


class CohereRerankResult(BaseModel):
    index: int
    relevance_score: float


class CohereRerankResponse(BaseModel):
    id: str
    results: list[CohereRerankResult]
    meta: dict[str, Any]


class OpenAIEmbeddingResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[OpenAIEmbedding]
    model: str
    usage: Usage


class Limits(BaseModel):
    max_batch_tokens: int
    max_batch_size: int
    max_client_batch_size: int
    max_text_chars: int
    payload_limit: int
    request_timeout: float


class VariantAgreement(BaseModel):
    """A lossy variant's answers against fp32's, measured at export on a fixed sample of real
    text (package.json parity.<variant>.agreement; heads.quality has the gates)."""

    metrics: dict[str, float] = Field(
        description="e.g. top1_agreement, entity_agreement, span_agreement, cosine_mean / _min."
    )
    gate: dict[str, float] = Field(description="The least each gated metric may be.")
    passed: bool
    sample: int | None = Field(default=None, description="Inputs in the export's sample.")
    choice: str | None = Field(
        default=None, description="The int8 choice written (which nodes stayed fp32)."
    )
    written: bool = Field(
        default=True, description="False: no choice passed, the export wrote no file."
    )


class ModelInfo(BaseModel):
    name: str = Field(description="The name it is served under: its folder's.")
    package_name: str | None = Field(
        default=None,
        description="The name its package.json gives, when that differs from the folder's.",
    )
    path: str
    state: Literal["loading", "ready", "failed"]
    error: str | None = None
    version: str | None = Field(
        default=None, description="The start of package.json's sha256 (it holds every file's)."
    )
    loaded_at: float | None = Field(default=None, description="When it was loaded (Unix time).")
    reload_error: str | None = Field(
        default=None, description="Why a newer version did not load; this version serves on."
    )
    task: str | None = None
    default_for: list[str] | None = Field(
        default=None,
        description="The request tasks this model answers when a request names no model "
        "(GET /models `defaults`).",
    )
    labels: list[str] | None = None
    reads: Literal["single", "pairs", "unknown"] | None = Field(
        default=None,
        description="Classification: what the model was trained to read, single texts or "
        "pairs (package.json `reads`); unknown for a package exported before it was recorded.",
    )
    problem_type: str | None = None
    pooling: str | None = None
    normalize: bool | None = None
    hidden_states: int | None = Field(
        default=None, description="Embedding: hidden states /embed `layers` can read (L + 1)."
    )
    base: str | None = Field(
        default=None,
        description="An adapter package: the encoder package it runs over (heads.adapters).",
    )
    adapter: dict[str, Any] | None = Field(
        default=None,
        description="An adapter package: its kind (lora, frozen), rank, adapted layers "
        "(targets) and the bytes of its weights in memory.",
    )
    adapters: list[str] | None = Field(
        default=None, description="An encoder package: the adapters that run over it."
    )
    prompts: dict[str, str] | None = Field(
        default=None, description="Embedding: the `prompt_name`s /embed takes, and their texts."
    )
    default_prompt_name: str | None = None
    max_seq_length: int | None = None
    special_tokens: dict[str, Any] | None = Field(
        default=None,
        description="role (pad, cls, sep, mask, unk, bos, eos) -> {token, id, source}: what the "
        "checkpoint declared, read at export; rows are padded with pad's id.",
    )
    variant: str | None = None
    variants: list[str] | None = None
    agreement: dict[str, VariantAgreement] | None = Field(
        default=None,
        description="Per lossy variant the export measured: its agreement with fp32. int8 "
        "served with none recorded, or below its gate, is logged as a warning at load.",
    )
    provider: str | None = None
    warmup_seconds: float | None = None
    endpoints: list[str] | None = Field(
        default=None, description="The POST endpoints that serve this package."
    )


class ModelsResponse(BaseModel):
    models: list[ModelInfo]
    defaults: dict[str, str] = Field(
        default_factory=dict,
        description="request task (classification, rerank, zero-shot, ...) -> the model a "
        "request that names none gets: the only one that can answer, or the default.",
    )
    limits: Limits


class Health(BaseModel):
    status: Literal["alive", "dead"]
    models: list[str] | None = Field(
        default=None, description="When dead: the models whose batch worker has ended."
    )


class Readiness(BaseModel):
    ready: bool
    status: Literal["ready", "loading", "draining", "empty", "degraded"]
    models: dict[str, str] = Field(description="name -> loading | ready | failed: reason")


ClassifyResponse = list[LabelScore] | list[list[LabelScore]]
NerResponse = list[Entity] | list[list[Entity]]
QaResponse = Answer | list[Answer] | list[list[Answer]]
EmbedResponse = list[list[float]]


class TokenVectors(BaseModel):
    embeddings: list[list[float]]
    tokens: list[SimpleToken]


EmbedAllResponse = list[list[list[float]]] | list[TokenVectors]


class AnalyzeRequest(_Body):
    """Several heads trained on one frozen encoder, over the same texts, in one encoder pass:
    each named model's answer, as its own endpoint gives it."""

    inputs: Texts
    models: (
        Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)]
        | Annotated[dict[str, dict[str, Any]], Field(min_length=1)]
    ) = Field(
        description="The heads by name (a list), or name -> that head's options as its own "
        'endpoint takes them, e.g. {"sentiment": {"top_k": 2}, "entities": '
        '{"aggregation_strategy": "first"}}.'
    )


AnalyzeResponse = dict[str, Any]
