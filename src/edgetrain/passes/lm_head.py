"""The language model's head and its loss in vocabulary chunks (issue 32): a class loss over the
last dim of a linear layer's output becomes one op that computes the logits a chunk of the
vocabulary at a time (ops/lmloss.py), so the (T, V) logits and their gradient are never whole.

The pattern, in the training graph after the loss is attached (passes/loss.py):

    logits = linear(h, w[, b])  |  linear_qw(h, wq, scale[, b])     (frozen="int8" / "int4")
    [slice on a dim other than the last (causal_lm's shift) / reshape keeping the last dim]...
    loss = cross_entropy(logits', label; class_dim = the last)

with nothing else reading the logits or what the chain makes of them. It becomes

    h' = the same slices / reshapes applied to h (the last dim H instead of V)
    loss = linear_cross_entropy(h', label, w[, b]; chunk, ignore_index)
         | linear_qw_cross_entropy(h', label, wq, scale[, b]; chunk, ignore_index, bits, in_features)

The forward graph `predict` runs is another graph (full logits of every position): only the
training step is rewritten. A graph without the pattern is returned as it is.
"""
from __future__ import annotations

from collections import Counter
from typing import Optional

from ..ir import Graph, Node, Value
from ..ops import Emitter
from ..ops.lmloss import FORWARD_OPS
from ..ops.loss import IGNORE_INDEX

#: bytes of one chunk's logits (R rows x chunk vocabulary rows) the chunk is chosen to stay under
CHUNK_BYTES = 256 * 1024
#: a chunk is a multiple of this many vocabulary rows (when it is not the whole vocabulary)
CHUNK_MULTIPLE = 64
HEADS = ("linear", "linear_qw")


def chunk_rows(rows: int, vocab: int, itemsize: int, chunk_bytes: int = CHUNK_BYTES) -> int:
    """Vocabulary rows per chunk: as many as keep rows x chunk logits under `chunk_bytes`, a
    multiple of CHUNK_MULTIPLE (at least one multiple), the whole vocabulary when that fits."""
    fit = chunk_bytes // max(rows * itemsize, 1)
    if fit >= vocab:
        return vocab
    return min(vocab, max(CHUNK_MULTIPLE, fit // CHUNK_MULTIPLE * CHUNK_MULTIPLE))


def chunk_lm_head(g: Graph, chunk: Optional[int] = None, chunk_bytes: Optional[int] = None) -> Graph:
    """`g` with its linear head + cross entropy over the vocabulary fused into linear_cross_entropy
    (`chunk` vocabulary rows at a time; default: chunk_rows's choice under `chunk_bytes`, default
    CHUNK_BYTES as the module holds it when called); `g` itself when its loss is not a class loss
    over the last dim of a linear layer's output."""
    chunk_bytes = CHUNK_BYTES if chunk_bytes is None else chunk_bytes
    producer = {o: n for n in g.nodes for o in n.outputs}
    readers = Counter(v for n in g.nodes for v in n.inputs)
    readers.update(g.outputs)
    for ce in g.nodes:
        if ce.op != "cross_entropy":
            continue
        logits, label = ce.inputs
        if ce.attrs.get("class_dim", 1) != logits.type.rank - 1:
            continue
        chain = _chain(logits, producer, readers)
        if chain is not None:
            return _fused(g, ce, chain, chunk, chunk_bytes)
    return g


def _chain(logits: Value, producer, readers) -> Optional[list[Node]]:
    """[head, the slices / reshapes after it, in order] when `logits` comes from a linear head
    through them alone, each intermediate read by the next only; else None."""
    chain = []
    v = logits
    while True:
        n = producer.get(v)
        if n is None or readers[v] != 1:
            return None
        chain.append(n)
        if n.op in HEADS:
            return chain[::-1]
        x = n.inputs[0]
        if n.op == "slice" and n.attrs["dim"] % x.type.rank != x.type.rank - 1:
            v = x
        elif n.op == "reshape" and x.type.rank >= 1 and n.out.shape[-1:] == x.shape[-1:]:
            v = x
        else:
            return None


def _fused(g: Graph, ce: Node, chain: list[Node], chunk: Optional[int], chunk_bytes: int) -> Graph:
    head, views = chain[0], chain[1:]
    e = Emitter()
    h = head.inputs[0]
    hid = h.shape[-1]
    for n in views:
        if n.op == "slice":
            h = e.emit("slice", h, **n.attrs)
        else:
            h = e.emit("reshape", h, shape=tuple(n.out.shape[:-1]) + (hid,))
    label = ce.inputs[1]
    vocab = head.out.shape[-1]
    rows = label.type.numel
    attrs = {"chunk": chunk or chunk_rows(rows, vocab, h.type.nbytes // max(h.type.numel, 1), chunk_bytes),
             "ignore_index": ce.attrs.get("ignore_index", IGNORE_INDEX)}
    if head.op == "linear_qw":
        attrs.update(bits=head.attrs["bits"], in_features=head.attrs["in_features"])
    op = "linear_qw_cross_entropy" if head.op == "linear_qw" else "linear_cross_entropy"
    fused = Node(op, (h, label) + tuple(head.inputs[1:]), ce.outputs, attrs)
    gone = set(map(id, chain))
    nodes = []
    for n in g.nodes:
        if n is ce:
            nodes += e.nodes + [fused]
        elif id(n) not in gone:
            nodes.append(n)
    return g.replace(nodes=tuple(nodes))


def loss_in_backward(g: Graph) -> Graph:
    """`g` (a training step, after autodiff) with each fused head's forward loss node folded into
    its gradient node: linear[_qw]_cross_entropy_grad(with_loss=True) gives the loss too, from the
    max and sum of exp its first sweep computes anyway, so the step sweeps the vocabulary's logits
    twice instead of three times. Only when nothing before the gradient node reads the loss (the
    seed gradient is a constant); `g` itself when there is no such pair."""
    pos = {id(n): i for i, n in enumerate(g.nodes)}
    readers: dict = {}
    for i, n in enumerate(g.nodes):
        for v in n.inputs:
            readers.setdefault(v, []).append(i)
    forward = {(n.op, n.inputs): n for n in g.nodes if n.op in FORWARD_OPS}
    pairs = {}
    for n in g.nodes:
        if not n.op.endswith("_grad") or n.op[:-len("_grad")] not in FORWARD_OPS or n.attrs.get("with_loss"):
            continue
        f = forward.get((n.op[:-len("_grad")], n.inputs[1:]))
        if f is None or {k: v for k, v in n.attrs.items() if k != "wants"} != dict(f.attrs):
            continue
        if any(r <= pos[id(n)] for r in readers.get(f.out, [])):
            continue
        pairs[id(f)] = (f, n)
    if not pairs:
        return g
    merged = {id(n): Node(n.op, n.inputs, n.outputs + (f.out,), {**n.attrs, "with_loss": True})
              for f, n in pairs.values()}
    return g.replace(nodes=tuple(merged.get(id(n), n) for n in g.nodes if id(n) not in pairs))
