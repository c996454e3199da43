"""Core-aten -> IR converters of data-dependent shapes, in the patterns a static graph can
express (issue 31: BartForSequenceClassification as transformers writes it). They register into
converters.CONVERTERS and converters.DYNAMIC_AWARE (the package's __init__ imports this module);
aten.py's view, select and index converters hand these cases here.

- `x[mask]` with a boolean mask computed at run time (aten.index.Tensor) has as many rows as the
  mask has True: a `MaskedRows` stands for it. The one use translated picks one row per group,
  `x[mask].view(G, -1, *rest)[:, i]` (BART's head reads each sequence's last eos token:
  `hidden_states[eos_mask, :].view(B, -1, D)[:, -1, :]`): with n masked rows and k = n / G, group
  g's row i is the masked row whose running count (cumsum of the mask) is g*k + i + 1 (i < 0:
  (g+1)*k + i + 1), found per group without a division (G*count == g*n + G*(i+1)) and read with one
  `embedding` of x's rows. Where no row matches (n no multiple of G, or k too small for i: what
  torch's view / select refuse) row 0 is read and the MaskedRows keeps a run-time check that
  every group found its row (`MaskedRows.checks`: the capture puts it on the output).
- torch.unique_consecutive(x) computed at run time: `ConsecutiveUnique`; only its length is
  translated, 1 + the count of x[j] != x[j-1] (BART checks that every row has as many eos tokens:
  `torch_compilable_check(torch.unique_consecutive(eos_mask.sum(1)).numel() == 1, ...)`, a
  torch._check under torch.export; an `if ...: raise` on it is refused by torch.export itself).
- their sizes (`aten.sym_size.int`, torch.export's unbacked SymInts u0, u1) are `RunTimeInt`s: an
  expression of one `Symbol`, an integer known at run time whose possible values are known at
  capture; torch.export's arithmetic and comparisons on them (`operator.*`) stay symbolic.
- `aten._assert_async(cond, message)` of a bool tensor computed at run time (F.one_hot's range
  checks) is a `TensorCheck`, put on the output as the others below.
- `aten._assert_scalar(cond)` of one (torch.export's guards, and the model's own check: BART's
  becomes `Eq(u0, 1)`) is a `RunTimeCheck`; capture ends with `check_value` of each: a check that
  holds for every value its symbol can take (its range; for a MaskedRows count, the multiples of
  G its gather's own check leaves) is dropped, any other computed at run time (int64 compares),
  and `checked` puts them all, in the model's order, on the output as `check` ops (ops/check.py):
  where PyTorch raises, the reference runtime raises RunTimeCheckError with the check's message
  (the C backend's runner too: kernels/check.py).

Anything else reading one of these is refused by name (converters.convert_node).
"""
from __future__ import annotations

import math
import operator
from typing import Callable, Optional

from ..ir import Value
from ..ops import Emitter
from ..ops.check import CHECK
from .converters import CONVERTERS, DYNAMIC_AWARE, Dynamic, Known, aten, converts, unsupported

_FLOATS = ("float32", "float64")
#: at most this many intervals of allowed values make a run-time check (else it is refused)
MAX_INTERVALS = 4


def dynamic_aware(*ops):
    """Register a converter that also takes Dynamic operands."""
    def deco(fn):
        for op in ops:
            CONVERTERS[op] = fn
            DYNAMIC_AWARE.add(op)
        return fn

    return deco


def _int64(e: Emitter, v: Value) -> Value:
    return v if v.dtype == "int64" else e.emit("cast", v, dtype="int64")


def _count(e: Emitter, mask: Value, dims=None) -> Value:
    """The number of True of a bool Value over dims (float32 sum: exact below 2**24), int64."""
    return _int64(e, e.emit("sum", e.emit("cast", mask, dtype="float32"), dims=dims))


class Symbol(Dynamic):
    """An integer known at run time: `values` are those it can take, `make(e)` computes it
    (an int64 scalar Value, made once)."""

    def __init__(self, what: str, values, make: Callable[[Emitter], Value]):
        self.what, self.values, self._make, self._value = what, tuple(values), make, None

    def value(self, e: Emitter) -> Value:
        if self._value is None:
            self._value = self._make(e)
        return self._value

    def narrow(self, keep: Callable[[int], bool]):
        """Only the values `keep` admits occur (a gather out of range stops the others)."""
        self.values = tuple(v for v in self.values if keep(v))


class RunTimeInt(Dynamic):
    """fn(symbol) for a Python function fn of one integer: an int or a bool at run time."""

    def __init__(self, symbol: Symbol, fn: Callable[[int], int] = lambda v: v):
        self.symbol, self.fn = symbol, fn
        self.what = symbol.what


def _sym_op(op: Callable):
    def conv(e, a, b=None):
        args = (a,) if b is None and op in (operator.neg, operator.not_) else (a, b)
        syms = {x.symbol for x in args if isinstance(x, RunTimeInt)}
        if len(syms) != 1 or any(not isinstance(x, (RunTimeInt, int, bool)) for x in args):
            unsupported(f"unsupported op {getattr(op, '__name__', op)} of sizes known only at run time "
                        "(only one data-dependent size with Python integers)")
        (sym,) = syms
        fns = [x.fn if isinstance(x, RunTimeInt) else (lambda v, c=x: c) for x in args]
        return RunTimeInt(sym, lambda v: op(*(f(v) for f in fns)))

    return conv


for _op in (operator.add, operator.sub, operator.mul, operator.floordiv, operator.mod, operator.eq,
            operator.ne, operator.lt, operator.le, operator.gt, operator.ge, operator.neg, operator.not_,
            operator.and_, operator.or_):
    dynamic_aware(_op)(_sym_op(_op))


class RunTimeCheck(Dynamic):
    """aten._assert_scalar of a condition known at run time: torch.export's message with it."""

    what = "a run-time check"

    def __init__(self, cond: RunTimeInt, message: str):
        self.cond, self.message = cond, message


@dynamic_aware(aten._assert_scalar.default)
def _assert_scalar(e, cond, message=""):
    if isinstance(cond, RunTimeInt):
        return RunTimeCheck(cond, str(message))
    if not bool(cond):  # never reached: a known condition is evaluated at capture
        raise ValueError(f"torch.export's check fails on the example input: {message}")
    return None


class TensorCheck(Dynamic):
    """aten._assert_async(cond, message) of a bool tensor computed at run time (F.one_hot's "Class
    values must be smaller than num_classes."): a check on the output as a RunTimeCheck's."""

    what = "a run-time check"

    def __init__(self, ok: Value, message: str):
        self.ok, self.message = ok, message


@converts(aten._assert_async.msg, aten._assert_async.default)
def _assert_async(e, cond, message="a run-time assert of the model"):
    if isinstance(cond, Value):
        if cond.type.numel != 1:
            raise ValueError(f"aten._assert_async of a {tuple(cond.shape)} tensor: torch asserts one element")
        return TensorCheck(cond, str(message))
    if not bool(cond.tensor if isinstance(cond, Known) else cond):
        raise ValueError(f"the model's check fails on the example input: {message}")
    return None


def _runs(values: tuple, allowed) -> list[tuple[int, int]]:
    """The runs (first, last) of consecutive allowed values among `values` (sorted)."""
    runs, start = [], None
    for k, v in enumerate(values):
        if v in allowed and start is None:
            start = v
        if v not in allowed and start is not None:
            runs.append((start, values[k - 1]))
            start = None
    if start is not None:
        runs.append((start, values[-1]))
    return runs


def check_value(e: Emitter, check: RunTimeCheck) -> Optional[Value]:
    """A bool scalar Value true when `check` holds at run time; None when it holds for every value
    its symbol can take."""
    sym = check.cond.symbol
    values = tuple(sorted(sym.values))
    allowed = {v for v in values if check.cond.fn(v)}
    if len(allowed) == len(values):
        return None
    runs = _runs(values, allowed)
    if not runs or len(runs) > MAX_INTERVALS:
        unsupported(f"unsupported run-time check ({check.message}) of {sym.what}: it holds on {len(runs)} "
                    f"intervals of its values (at most {MAX_INTERVALS} translated)")
    v = sym.value(e)
    ok = None
    for first, last in runs:
        conds = [e.emit("compare", v, e.const(first, "int64"), cmp="ge")] if first != values[0] else []
        conds += [e.emit("compare", v, e.const(last, "int64"), cmp="le")] if last != values[-1] else []
        run = conds[0] if len(conds) == 1 else e.emit("where", conds[0], conds[1], e.const(False, "bool"))
        ok = run if ok is None else e.emit("where", ok, e.const(True, "bool"), run)
    return ok


def checked(e: Emitter, checks: list, out: Value) -> Value:
    """`out` through one `check` op (ops/check.py: a view of it) per (ok, message) of `checks`, in
    their order: the first that fails at run time stops the program with its message. Nothing
    removes them: the output is computed through them."""
    for ok, message in checks:
        out = e.emit(CHECK, out, ok, message=message)
    return out


# --- torch.unique_consecutive ---------------------------------------------------------------
class ConsecutiveUnique(Dynamic):
    """torch.unique_consecutive(x) (flattened) of a Value x: only its length is known, at run time."""

    def __init__(self, x: Value):
        self.what = f"torch.unique_consecutive of a {tuple(x.shape)} tensor"
        n = math.prod(x.shape)
        def length(e: Emitter) -> Value:
            v = x if len(x.shape) == 1 else e.emit("reshape", x, shape=(n,))
            if n == 1:
                return e.const(1, "int64")
            steps = e.emit("compare", e.emit("slice", v, dim=0, start=1, end=n, step=1),
                           e.emit("slice", v, dim=0, start=0, end=n - 1, step=1), cmp="ne")
            return e.emit("add", _count(e, steps), e.const(1, "int64"))

        self.length = Symbol(f"the length of {self.what}", range(1, n + 1) if n else (0,), length)


@dynamic_aware(aten.unique_consecutive.default)
def _unique_consecutive(e, x, return_inverse=False, return_counts=False, dim=None):
    if not isinstance(x, Value) or dim is not None:
        unsupported("unsupported op aten.unique_consecutive along a dim (only of a whole tensor)")
    return ConsecutiveUnique(x), None, None


# --- x[mask] ------------------------------------------------------------------------------------
class MaskedRows(Dynamic):
    """x[mask] of a float Value x and a bool Value mask on x's leading dims: as many rows (of
    x's other dims) as the mask has True."""

    def __init__(self, x: Value, mask: Value):
        self.x, self.mask = x, mask
        self.rest = tuple(x.shape[len(mask.shape):])
        self.n = math.prod(mask.shape)
        self.what = f"x[mask] of a {tuple(x.shape)} tensor and a {tuple(mask.shape)} mask computed at run time"
        self._counts = None
        #: (bool scalar Value, message): what its gathers need at run time (dynamic_select)
        self.checks: list[tuple[Value, str]] = []
        self.count = Symbol(f"the number of rows of {self.what}", range(self.n + 1),
                            lambda e: e.emit("reshape", e.emit("slice", self.counts(e), dim=0, start=self.n - 1,
                                                               end=self.n, step=1), shape=()))

    def counts(self, e: Emitter) -> Value:
        """The running count of True over the flat mask (int64 cumsum), made once."""
        if self._counts is None:
            flat = e.emit("reshape", self.mask, shape=(self.n,))
            self._counts = e.emit("cumsum", _int64(e, flat), dim=0, reverse=False)
        return self._counts


def masked_rows(e: Emitter, x: Value, indices: list) -> MaskedRows:
    """aten.index.Tensor of x with one bool mask computed at run time on its leading dims."""
    indices = list(indices)
    while len(indices) > 1 and indices[-1] is None:  # x[mask, :]
        indices.pop()
    if len(indices) != 1 or not isinstance(indices[0], Value):
        unsupported("unsupported op aten.index.Tensor with a boolean mask computed at run time beside other "
                    "indices (only x[mask] on x's leading dims)")
    mask = indices[0]
    if x.dtype not in _FLOATS or tuple(mask.shape) != tuple(x.shape[:len(mask.shape)]) or not mask.shape:
        unsupported(f"unsupported op aten.index.Tensor of a {x.dtype} {tuple(x.shape)} tensor with a "
                    f"{tuple(mask.shape)} boolean mask computed at run time (only float tensors, the mask on "
                    "their leading dims)")
    return MaskedRows(x, mask)


class MaskedGroups(Dynamic):
    """x[mask].view(G, -1, *rest): G groups of the masked rows."""

    def __init__(self, rows: MaskedRows, groups: int):
        self.rows, self.groups = rows, groups
        self.what = f"{rows.what}, viewed as {groups} groups"


def dynamic_view(e: Emitter, x, shape) -> Dynamic:
    """view / reshape of a MaskedRows as (G, -1, *rest) (or (-1, *rest): itself)."""
    shape = list(shape)
    if isinstance(x, MaskedRows) and all(isinstance(d, int) for d in shape):
        if shape == [-1, *x.rest]:
            return x
        if len(shape) == len(x.rest) + 2 and shape[1] == -1 and tuple(shape[2:]) == x.rest and shape[0] >= 1:
            return MaskedGroups(x, shape[0])
    what = x.what if isinstance(x, Dynamic) else "a shape known only at run time"
    unsupported(f"unsupported op aten.view of {what} as {shape} (only x[mask].view(G, -1, *x's other dims))")


def dynamic_select(e: Emitter, x, dim: int, index: int) -> Value:
    """x[mask].view(G, -1, *rest)[:, index]: group g's row `index`, one embedding of x's rows."""
    if not (isinstance(x, MaskedGroups) and dim in (1, -len(x.rows.rest) - 2) and isinstance(index, int)):
        unsupported(f"unsupported op aten.select of {x.what} on dim {dim} (only [:, i] of "
                    "x[mask].view(G, -1, ...))")
    rows, g = x.rows, x.groups
    need = index + 1 if index >= 0 else -index  # the rows a group must have
    counts = rows.counts(e)
    n_rows = rows.count.value(e)
    # target of group j: G * count == j' * n + G * (index + 1), j' = j (index >= 0) or j + 1
    groups = e.emit("cumsum", e.emit("expand", e.const(1, "int64"), shape=(g,)), dim=0, reverse=False)
    if index >= 0:
        groups = e.emit("sub", groups, e.const(1, "int64"))
    target = e.emit("add", e.emit("mul", groups, n_rows), e.const(g * (index + 1), "int64"))
    scaled = e.emit("mul", counts, e.const(g, "int64"))
    hit = e.emit("compare", scaled, e.emit("reshape", target, shape=(g, 1)), cmp="eq")  # (G, n)
    flat_mask = e.emit("reshape", rows.mask, shape=(rows.n,))
    hit = e.emit("where", flat_mask, hit, e.const(False, "bool"))
    scores = e.emit("cast", hit, dtype="float32")
    pos = e.emit("argmax", scores, dim=1, keepdim=False)  # none found: row 0, and the check fails
    found = e.emit("compare", e.emit("sum", scores, dims=(1,)), e.const(0.0, "float32"), cmp="gt")
    every = e.emit("compare", _count(e, found), e.const(g, "int64"), cmp="eq")
    rest = ", ".join(str(d) for d in rows.rest)
    rows.checks.append((every, f"x[mask].view({g}, -1, {rest})[:, {index}]: the mask's True count is not {g} "
                               f"groups of at least {need} (torch's view or select refuses it)"))
    rows.count.narrow(lambda v: v % g == 0 and v // g >= need)  # the others stop at that check
    width = math.prod(rows.rest)
    table = e.emit("reshape", rows.x, shape=(rows.n, width))
    picked = e.emit("embedding", table, pos)
    return picked if (g,) + rows.rest == (g, width) else e.emit("reshape", picked, shape=(g,) + rows.rest)


@dynamic_aware(aten.sym_size.int)
def _sym_size(e, x, dim=0):
    if isinstance(x, Value):
        return int(x.shape[dim])
    if isinstance(x, MaskedRows):
        return RunTimeInt(x.count) if dim == 0 else int(x.rest[dim - 1])
    if isinstance(x, ConsecutiveUnique) and dim == 0:
        return RunTimeInt(x.length)
    unsupported(f"unsupported op aten.sym_size of {getattr(x, 'what', type(x).__name__)} on dim {dim}")
