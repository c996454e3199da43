"""Page ops (ops/page.py): a tensor written to / read back from secondary storage through
the storage API of runtime/et_page.h (`et_page_write(offset, src, n)`,
`et_page_read(offset, dst, n)`), any dtype. The store itself has no C array: it is the
storage behind that API (a file on the host)."""
from __future__ import annotations

from .registry import register


@register("page_out")
def _page_out(node, ctx):
    x = node.inputs[1]
    return f"{{ et_page_write({int(node.attrs['offset'])}L, {ctx.ptr(x)}, {x.type.nbytes}u); }}"


@register("page_in")
def _page_in(node, ctx):
    y = node.out
    return f"{{ et_page_read({int(node.attrs['offset'])}L, {ctx.ptr(y)}, {y.type.nbytes}u); }}"
