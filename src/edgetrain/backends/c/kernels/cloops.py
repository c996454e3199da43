"""The C code shapes the kernel families share: element strides (contiguous and broadcast),
nested loops with constant bounds over them, and a C block."""
from __future__ import annotations


def contiguous_strides(shape):
    """Element strides of a contiguous (row-major) tensor of `shape`."""
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return tuple(reversed(out))


def broadcast_strides(in_shape, out_shape):
    """Element strides of an input broadcast to out_shape (0 on broadcast dims)."""
    lead = len(out_shape) - len(in_shape)
    st = contiguous_strides(in_shape)
    return tuple(0 if i < lead or in_shape[i - lead] == 1 and out_shape[i] != 1 else st[i - lead]
                 for i in range(len(out_shape)))


def merge_dims(shape, stride_sets):
    """Collapse adjacent dims that every operand walks contiguously; drop size-1 dims."""
    dims = [(d, [s[i] for s in stride_sets]) for i, d in enumerate(shape) if d != 1]
    out = []
    for d, st in dims:
        if out:
            pd, pst = out[-1]
            if all(a == b * d for a, b in zip(pst, st)):
                out[-1] = (pd * d, st)
                continue
        out.append((d, st))
    return [d for d, _ in out], [[st[k] for _, st in out] for k in range(len(stride_sets))]


#: elements from which an elementwise loop nest is split across the host's threads (parallel=True);
#: runtime/et_common.h's ET_PARALLEL_MIN_WORK decides again at run time
PARALLEL_MIN_ELEMENTS = 32768


def loop_nest(shape, ptr_strides, body, parallel: bool = False) -> str:
    """Nested loops over `shape`; `ptr_strides` is a list of element-stride tuples, one per
    operand; `body(offsets)` gets each operand's offset expression and returns C statements.
    parallel=True (each element written once, from its own operands' elements only): a nest of at
    least PARALLEL_MIN_ELEMENTS splits its outer loop across the host's threads (runtime/et_common.h's
    ET_PARALLEL_FOR, empty without OpenMP); every element's arithmetic is the same on any thread."""
    dims, strides = merge_dims(tuple(shape), [tuple(s) for s in ptr_strides])
    if not dims:
        return body(["0"] * len(ptr_strides))
    lines, offs = [], []
    numel = 1
    for d in dims:
        numel *= d
    par = parallel and numel >= PARALLEL_MIN_ELEMENTS
    for s in strides:
        offs.append(" + ".join(f"i{j} * {st}" for j, st in enumerate(s) if st) or "0")
    for j, d in enumerate(dims):
        if j == 0 and par:
            lines.append(f"ET_PARALLEL_FOR{'_SIMD' if len(dims) == 1 else ''}({numel})")
        elif j == len(dims) - 1:
            lines.append("ET_SIMD")
        lines.append("  " * j + f"for (int i{j} = 0; i{j} < {d}; ++i{j})")
    lines.append("  " * len(dims) + "{ " + body(offs) + " }")
    return "\n".join(lines)


def c_block(*lines) -> str:
    """The lines as one C block `{ ... }`."""
    return "{\n" + "\n".join(lines) + "\n}"
