"""The attention ONNX Runtime's BERT fusion leaves unfused, rewritten into its contrib ops, to
measure what fusing it would buy (benchmarks.family_speed). Measured, it did not pay on CPU,
so training.export does not apply it (benchmarks/README.md, "Issue 46: attention of the
families with encoders of their own").

ORT's optimizer (`optimize_model(..., "bert")`) fuses an attention block only when its scores
are softmax(Q K^T / c + padding mask). MPNet adds a relative position bias to the scores,
DeBERTa-v2 its disentangled c2p + p2c terms, and ModernBERT's SDPA exports its scale as a
computation on Q and K, so their attention stays some twenty plain nodes a layer. `rewrite`
finds each such block in a graph ORT's optimizer made and replaces it by one node of ORT's
com.microsoft domain:

    MPNet       scores = (x Wq + bq)(x Wk + bk)^T / c + bias     bias: computed before the
                -> MultiHeadAttention(x Wq, x Wk, x Wv, bias=[bq|bk|bv], attention_bias=bias)
                -> Attention(x, [Wq|Wk|Wv], [bq|bk|bv], attention_bias=bias)   (packed=True)
    DeBERTa-v2  scores = where(mask, Q K^T / c + rel, min)       rel reads Q and K
                -> MultiHeadAttention(Q, K, V, attention_bias=where(mask, rel, min))
    ModernBERT  scores = (Q s)(K^T s) + mask, s = hs^-1/4         Q, K rotated (RoPE)
                -> MultiHeadAttention(Q as (B, T, H), K, V as (B, nh, T, hs), mask)

Softmax, the two batched matmuls and the head transposes become one kernel. `where(mask, rel,
min)` equals the scores' mask: Q K^T / c + min rounds to min for any score below ~1e31. A
bias made before the layers is expanded over the queries once ((B, 1, 1, T) masks: the
contrib ops want (.., T, T)). Attention packs the three projections into one GEMM, but ORT's
int8 quantizer turns it into a QAttention, which has no attention_bias input: it would drop
MPNet's bias and mask, so it is measured only as an option.

A block whose nodes do not have exactly these shapes is left alone.

    >>> rewrite(model_proto, num_heads=12)   # in place
    {'Attention': 0, 'MultiHeadAttention': 12}
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

MS = "com.microsoft"
HEADS_FIRST = [0, 2, 1, 3]  # (B, T, nh, hs) <-> (B, nh, T, hs)
KEYS_TRANSPOSED = [0, 2, 3, 1]  # (B, T, nh, hs) -> (B, nh, hs, T)
K_TRANSPOSES = ([0, 1, 3, 2], KEYS_TRANSPOSED)  # K^T from K (B, nh, T, hs) or (B, T, nh, hs)


class Graph:
    """Who produces and who reads each value of a graph; constants by name."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.graph = model.graph
        self.producer = {o: n for n in self.graph.node for o in n.output if o}
        self.readers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
        for n in self.graph.node:
            for i in n.input:
                self.readers[i].append(n)
        self.outputs = {o.name for o in self.graph.output}
        self.initializers = {t.name: t for t in self.graph.initializer}

    def parent(self, node: onnx.NodeProto, index: int, op: str) -> onnx.NodeProto | None:
        """The node of type `op` producing input `index` of `node`, else None."""
        if index >= len(node.input):
            return None
        found = self.producer.get(node.input[index])
        return found if found is not None and found.op_type == op else None

    def only_reader(self, name: str, op: str) -> onnx.NodeProto | None:
        """The one node of type `op` reading `name`, besides Shape nodes (the exporter reads
        shapes of intermediates to build the next Reshape's target)."""
        readers = [r for r in self.readers.get(name, []) if r.op_type != "Shape"]
        ok = len(readers) == 1 and readers[0].op_type == op and name not in self.outputs
        return readers[0] if ok else None

    def feeds_only(
        self, node: onnx.NodeProto, inside: set[int], known: dict[int, bool] | None = None
    ) -> bool:
        """Whether everything `node` computes ends up read only by nodes in `inside`."""
        known = {} if known is None else known
        if id(node) not in known:
            known[id(node)] = False  # (a graph has no cycles; this only stops a revisit)
            known[id(node)] = not any(o in self.outputs for o in node.output) and all(
                id(r) in inside or self.feeds_only(r, inside, known)
                for o in node.output
                for r in self.readers.get(o, [])
            )
        return known[id(node)]

    def constant(self, name: str) -> np.ndarray | None:
        if name in self.initializers:
            return numpy_helper.to_array(self.initializers[name])
        node = self.producer.get(name)
        if node is not None and node.op_type == "Constant":
            value = next((a for a in node.attribute if a.name == "value"), None)
            return numpy_helper.to_array(value.t) if value is not None else None
        return None


def _perm(node: onnx.NodeProto | None) -> list[int] | None:
    if node is None:
        return None
    return next((list(a.ints) for a in node.attribute if a.name == "perm"), None)


@dataclass
class Projection:
    """x W + b split into heads: MatMul -> Add -> Reshape -> Transpose (the nodes, in order)."""

    x: str
    weight: np.ndarray  # (H, H)
    bias: np.ndarray  # (H,)
    projected: str  # (B, T, H): x W + b
    heads: str  # the Transpose's output
    nodes: list[onnx.NodeProto]


def _projection(g: Graph, heads: str, perm: list[int]) -> Projection | None:
    """The projection whose heads `heads` is, transposed by `perm` after the Reshape."""
    transpose = g.producer.get(heads)
    if transpose is None or transpose.op_type != "Transpose" or _perm(transpose) != perm:
        return None
    reshape = g.parent(transpose, 0, "Reshape")
    add = g.parent(reshape, 0, "Add") if reshape else None
    if add is None:
        return None
    for m, b in ((0, 1), (1, 0)):
        matmul, bias = g.parent(add, m, "MatMul"), g.constant(add.input[b])
        weight = g.constant(matmul.input[1]) if matmul else None
        if weight is None or bias is None or weight.ndim != 2 or bias.shape != weight.shape[1:]:
            continue
        nodes = [matmul, add, reshape, transpose]
        return Projection(matmul.input[0], weight, bias, add.output[0], heads, nodes)
    return None


def _scale(g: Graph, node: onnx.NodeProto | None) -> tuple[float, str] | None:
    """(factor, the other input) of a Div or Mul by a scalar constant."""
    if node is None or node.op_type not in ("Div", "Mul"):
        return None
    for k in (1, 0) if node.op_type == "Mul" else (1,):
        c = g.constant(node.input[k])
        if c is not None and c.size == 1:
            value = float(c.reshape(()))
            return (1.0 / value if node.op_type == "Div" else value), node.input[1 - k]
    return None


@dataclass
class Heads:
    """Q, K, V as the scores and the weighted sum read them, each (B, nh, T, hs); K
    (B, T, nh, hs) instead when `k_tokens_first`."""

    q: str
    k: str
    v: str
    k_tokens_first: bool


@dataclass
class Block:
    """One attention block: softmax(scale * Q K^T + bias [masked]) V, heads merged.

    Its Q, K, V are either `projections` of one input (MPNet, DeBERTa) or `heads`, tensors
    (B, nh, T, hs) computed some other way (ModernBERT's rotated Q and K, after SDPA's export)."""

    q_heads: str  # (B, nh, T, hs)
    projections: tuple[Projection, Projection, Projection] | None
    heads: Heads | None
    scale: float | None  # None: 1 / sqrt(hs), MultiHeadAttention's default
    bias: str  # added to the scaled scores (a tensor computed outside the block)
    mask: tuple[str, str] | None  # Where(condition, scores, fill): (condition, fill)
    out: str  # (B, T, H) after the heads are merged
    tokens: tuple[str, int]  # a tensor the rewrite keeps, and its axis of T
    reads_q: bool  # the bias is computed from Q (DeBERTa's): it has the scores' shape
    nodes: list[onnx.NodeProto] = field(default_factory=list)  # the core, removed
    shapes: list[onnx.NodeProto] = field(default_factory=list)  # Shape(scores), rebuilt


def _match(g: Graph, softmax: onnx.NodeProto) -> Block | None:
    axis = next((a.i for a in softmax.attribute if a.name == "axis"), -1)
    if axis not in (-1, 3):
        return None
    core = [softmax]
    scores, mask = softmax.input[0], None
    where = g.parent(softmax, 0, "Where")
    if where is not None:  # masked_fill(~mask, min) as torch exports it
        fill = g.constant(where.input[2])
        if fill is None or fill.size != 1 or float(fill.reshape(())) > -1e30:
            return None
        scores, mask = where.input[1], (where.input[0], where.input[2])
        core.append(where)
    add = g.producer.get(scores)
    if add is None or add.op_type != "Add":
        return None
    core.append(add)
    for s, b in ((0, 1), (1, 0)):
        node = g.producer.get(add.input[s])
        found = _projected_scores(g, node) or _sdpa_scores(g, node)
        if found is not None:
            nodes, q_heads, projections, heads, scale = found
            return _finish(g, softmax, core + nodes, q_heads, projections, heads, scale,
                           add.input[b], mask)  # fmt: skip
    return None


Scores = tuple[
    list[onnx.NodeProto],
    str,
    tuple[Projection, Projection, Projection] | None,
    Heads | None,
    float | None,
]


def _projected_scores(g: Graph, node: onnx.NodeProto | None) -> Scores | None:
    """scale * Q K^T with Q, K projections of one input (V is found later)."""
    scaled = _scale(g, node)
    qk = g.producer.get(scaled[1]) if scaled else None
    if node is None or scaled is None or qk is None or qk.op_type != "MatMul":
        return None
    q = _projection(g, qk.input[0], HEADS_FIRST)
    k = _projection(g, qk.input[1], KEYS_TRANSPOSED)
    if q is None or k is None or q.x != k.x:
        return None
    return [node, qk], q.heads, (q, k, q), None, scaled[0]  # V's placeholder: _finish


def _sdpa_scores(g: Graph, qk: onnx.NodeProto | None) -> Scores | None:
    """(Q s)(K^T s), s = sqrt(1 / sqrt(hs)): torch's scaled_dot_product_attention exported,
    Q and K any (B, nh, T, hs) tensors."""
    if qk is None or qk.op_type != "MatMul":
        return None
    scaled = [g.producer.get(i) for i in qk.input]
    if any(m is None or m.op_type != "Mul" for m in scaled):
        return None
    q_mul, k_mul = scaled
    assert q_mul is not None and k_mul is not None
    for qi in (0, 1):
        for ki in (0, 1):
            q, s = q_mul.input[qi], q_mul.input[1 - qi]
            k_t, s2 = k_mul.input[ki], k_mul.input[1 - ki]
            transpose = g.producer.get(k_t)
            if s != s2 or not _sdpa_scale(g, s) or _perm(transpose) not in K_TRANSPOSES:
                continue
            assert transpose is not None
            # K is (B, T, nh, hs) where ORT's optimizer moved the rotation before the transpose
            heads = Heads(q, transpose.input[0], "", _perm(transpose) == KEYS_TRANSPOSED)
            return [qk, q_mul, k_mul, transpose], q, None, heads, None
    return None


def _sdpa_scale(g: Graph, name: str) -> bool:
    """Whether `name` is Sqrt(1 / Sqrt(Cast(Slice(Shape(.))))), SDPA's scale split over Q and K."""
    node = g.producer.get(name)
    chain = ["Sqrt", "Div", "Sqrt", "Cast", "Slice", "Shape"]
    for k, op in enumerate(chain):
        if node is None or node.op_type != op:
            return False
        if op == "Div":
            one = g.constant(node.input[0])
            if one is None or one.size != 1 or float(one.reshape(())) != 1.0:
                return False
            node = g.producer.get(node.input[1])
        elif k < len(chain) - 1:
            node = g.producer.get(node.input[0])
    return True


def _finish(
    g: Graph,
    softmax: onnx.NodeProto,
    core: list[onnx.NodeProto],
    q_heads: str,
    projections: tuple[Projection, Projection, Projection] | None,
    heads: Heads | None,
    scale: float | None,
    bias: str,
    mask: tuple[str, str] | None,
) -> Block | None:
    """The value side: softmax -> MatMul(., V heads) -> Transpose -> Reshape (B, T, H)."""
    pv = g.only_reader(softmax.output[0], "MatMul")
    if pv is None or pv.input[0] != softmax.output[0]:
        return None
    merge = g.only_reader(pv.output[0], "Transpose")
    reshape = g.only_reader(merge.output[0], "Reshape") if merge else None
    if _perm(merge) != HEADS_FIRST or reshape is None:
        return None
    if projections is not None:
        v = _projection(g, pv.input[1], HEADS_FIRST)
        if v is None or v.x != projections[0].x:
            return None
        projections = (projections[0], projections[1], v)
    if heads is not None:
        heads.v = pv.input[1]
    nodes = [*core, pv, merge, reshape]
    inside = {id(n) for n in nodes}
    # Shape(scores), (B, nh, T, T), is the one thing outside the block may read from it
    # (DeBERTa expands its relative indices to it); it is rebuilt from Q's shape.
    shapes = [r for n in core for o in n.output for r in g.readers.get(o, [])
              if r.op_type == "Shape" and _whole(r)]  # fmt: skip
    leaves = {id(n) for n in shapes}
    sources = {id(n) for n in _ancestors(g, bias, leaves)}
    if sources & inside:
        return None  # the bias reads the scores themselves: it is not a bias
    if not all(g.feeds_only(n, inside | leaves) for n in nodes[:-1]):
        return None  # what the block computes on the way is read outside it
    reads_q = id(g.producer.get(q_heads)) in sources
    tokens = (projections[0].x, 1) if projections is not None else (q_heads, 2)
    out = reshape.output[0]
    return Block(q_heads, projections, heads, scale, bias, mask, out, tokens, reads_q, nodes,
                 shapes)  # fmt: skip


def _whole(shape: onnx.NodeProto) -> bool:
    """Whether a Shape node reads the whole shape (no end, start 0)."""
    return all(a.name == "start" and a.i == 0 for a in shape.attribute)


def _ancestors(g: Graph, name: str, leaves: set[int]) -> Iterator[onnx.NodeProto]:
    """Every node `name` is computed from, not looking past the nodes in `leaves`."""
    seen: set[str] = set()
    todo = [name]
    while todo:
        value = todo.pop()
        node = g.producer.get(value)
        if node is None or value in seen:
            continue
        seen.add(value)
        yield node
        if id(node) not in leaves:
            todo += [i for i in node.input if i]


def _packable(g: Graph, block: Block) -> bool:
    """Whether the three projections are read by the block alone (then one GEMM does them)."""
    if block.projections is None or block.shapes:  # (rebuilt shapes read Q's heads)
        return False
    inside = {id(n) for n in block.nodes} | {id(n) for p in block.projections for n in p.nodes}
    return all(g.feeds_only(n, inside) for p in block.projections for n in p.nodes)


def rewrite(model: onnx.ModelProto, num_heads: int, packed: bool = False) -> dict[str, int]:
    """Rewrite, in place, every attention block ORT left unfused (see the module docstring);
    `packed`: MPNet's as Attention (one QKV GEMM) rather than MultiHeadAttention. Returns how
    many of each op it wrote; nothing is changed when none matches."""
    g = Graph(model)
    blocks = [b for n in list(g.graph.node) if n.op_type == "Softmax" if (b := _match(g, n))]
    written = {"Attention": 0, "MultiHeadAttention": 0}
    if not blocks:
        return written
    expanded: dict[str, str] = {}
    dead: set[int] = set()
    replaces: dict[int, list[onnx.NodeProto]] = {}  # a removed node -> what takes its place
    for i, block in enumerate(blocks):
        name = f"attention_rewrite_{i}"
        dead |= {id(n) for n in block.nodes}
        added = replaces[id(block.nodes[-1])] = []
        bias = block.bias
        if not block.reads_q:
            # A bias made before the layers (MPNet's position bias, ModernBERT's masks) may
            # broadcast over the queries, (B, 1, 1, T), which the contrib ops refuse: expanded
            # to (..., T, T) once for all the blocks that read it.
            if bias not in expanded:
                expanded[bias] = f"{name}_bias"
                added += _expand_over_queries(bias, block.tokens, expanded[bias], name)
            bias = expanded[bias]
        if block.mask is not None:  # mask the bias instead of the scores
            condition, fill = block.mask
            masked = f"{name}_masked_bias"
            added.append(helper.make_node("Where", [condition, bias, fill], [masked],
                                          name=f"{name}_mask"))  # fmt: skip
            bias = masked
        for j, shape in enumerate(block.shapes):  # (B, nh, T) of Q's heads, then T again
            lead, tail = f"{name}_shape{j}_lead", f"{name}_shape{j}_tail"
            dead.add(id(shape))
            replaces[id(shape)] = [
                helper.make_node("Shape", [block.q_heads], [lead], end=3),
                helper.make_node("Shape", [block.q_heads], [tail], start=2, end=3),
                helper.make_node("Concat", [lead, tail], list(shape.output), axis=0),
            ]
        attrs: dict[str, float | int] = {"num_heads": num_heads}
        if block.scale is not None:
            attrs["scale"] = block.scale
        if _packable(g, block):  # the projections are the block's alone
            assert block.projections is not None
            q, k, v = block.projections
            qkv_bias = f"{name}_qkv_bias"
            b = np.concatenate([q.bias, k.bias, v.bias])
            g.graph.initializer.append(numpy_helper.from_array(b, qkv_bias))
            if packed:
                weight = f"{name}_qkv_weight"
                w = np.concatenate([q.weight, k.weight, v.weight], axis=1)
                g.graph.initializer.append(numpy_helper.from_array(w, weight))
                dead |= {id(n) for p in block.projections for n in p.nodes}
                inputs = [q.x, weight, qkv_bias, "", "", bias]
                added.append(helper.make_node("Attention", inputs, [block.out], name=name,
                                              domain=MS, **attrs))  # fmt: skip
                written["Attention"] += 1
                continue
            # their MatMuls stay; the bias adds, head splits and transposes go
            dead |= {id(n) for p in block.projections for n in p.nodes[1:]}
            inputs = [p.nodes[0].output[0] for p in block.projections]
            added.append(helper.make_node("MultiHeadAttention", [*inputs, qkv_bias, "", bias],
                                          [block.out], name=name, domain=MS, **attrs))  # fmt: skip
            written["MultiHeadAttention"] += 1
            continue
        if block.projections is not None:  # they stay: the bias reads Q and K too (DeBERTa)
            inputs = [p.projected for p in block.projections]
        else:  # Q (B, nh, T, hs) -> (B, T, H); K and V go in as (B, nh, T, hs)
            heads = block.heads
            assert heads is not None
            added += [
                helper.make_node("Transpose", [heads.q], [f"{name}_q_bsnh"], perm=HEADS_FIRST),
                helper.make_node(
                    "Reshape", [f"{name}_q_bsnh", _merged(g, name)], [f"{name}_q"]
                ),  # fmt: skip
            ]
            k = heads.k
            if heads.k_tokens_first:
                k = f"{name}_k_bnsh"
                added.append(helper.make_node("Transpose", [heads.k], [k], perm=HEADS_FIRST))
            inputs = [f"{name}_q", k, heads.v]
        added.append(helper.make_node("MultiHeadAttention", [*inputs, "", "", bias],
                                      [block.out], name=name, domain=MS, **attrs))  # fmt: skip
        written["MultiHeadAttention"] += 1
    # In the graph's (topological) order, each replacement where what it replaces was: all it
    # reads (x, Q, K, V, the bias, the mask) was produced before the block's last node.
    nodes = []
    for n in g.graph.node:
        nodes += replaces.get(id(n), [])
        if id(n) not in dead:
            nodes.append(n)
    del g.graph.node[:]
    g.graph.node.extend(nodes)
    _prune(model)
    if not any(o.domain == MS for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS, 1))
    return written


def _merged(g: Graph, name: str) -> str:
    """A Reshape target (0, 0, -1): (B, T, nh, hs) -> (B, T, H)."""
    target = f"{name}_merged_shape"
    g.graph.initializer.append(numpy_helper.from_array(np.array([0, 0, -1], np.int64), target))
    return target


def _expand_over_queries(
    bias: str, tokens: tuple[str, int], out: str, name: str
) -> list[onnx.NodeProto]:
    """bias, broadcastable to (B, nh, T, T), made T long on its query axis: Expand(bias,
    (1, 1, T, 1)), T read from `tokens` (a tensor, the axis where it has T)."""
    one, t, shape = f"{name}_one", f"{name}_t", f"{name}_bias_shape"
    ones = numpy_helper.from_array(np.ones(1, np.int64))
    return [
        helper.make_node("Constant", [], [one], value=ones),
        helper.make_node("Shape", [tokens[0]], [t], start=tokens[1], end=tokens[1] + 1),
        helper.make_node("Concat", [one, one, t, one], [shape], axis=0),
        helper.make_node("Expand", [bias, shape], [out]),
    ]


def _prune(model: onnx.ModelProto) -> None:
    """Drop nodes nothing reads (the shape arithmetic of removed Reshapes) and unread
    initializers (the unpacked projection weights)."""
    graph = model.graph
    needed = {o.name for o in graph.output}
    kept = []
    for node in reversed(list(graph.node)):
        if any(o in needed for o in node.output):
            kept.append(node)
            needed.update(i for i in node.input if i)
    del graph.node[:]
    graph.node.extend(reversed(kept))
    unused = [t for t in graph.initializer if t.name not in needed]
    for t in unused:
        graph.initializer.remove(t)
