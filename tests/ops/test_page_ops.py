"""The page ops (ops/page.py): a tensor written to a store bound to a real file and read
back, the bytes counted by the runtime; the store is threaded through the graph."""
import numpy as np
import pytest

from edgetrain.interpreter import run_graph
from edgetrain.ir import Graph, Node, TensorType, new_value
from edgetrain.ops import VerificationError, verify
from edgetrain.remat.apply import STORE_NAME

#: ops tested here and by tests/remat/test_apply.py (schedules that page, reference and C)
PAGE_OPS_TESTED = {"page_in", "page_out"}


def test_page_ops_write_to_and_read_from_a_file(tmp_path):
    store = new_value(TensorType((64,), "int8"), STORE_NAME)
    x = new_value(TensorType((2, 3), "float32"), "x")
    s1 = new_value(store.type, STORE_NAME)
    y = new_value(x.type, "y")
    g = verify(Graph((store, x), (Node("page_out", (store, x), (s1,), {"offset": 16}),
                                  Node("page_in", (s1,), (y,), {"offset": 16, "shape": (2, 3), "dtype": "float32"})),
                     (y,), ("y",)))
    path = tmp_path / "pages.bin"
    path.write_bytes(bytes(64))
    mm = np.memmap(path, dtype=np.int8, mode="r+", shape=(64,))
    xv = np.arange(6, dtype=np.float32).reshape(2, 3) + 0.5
    out, trace = run_graph(g, {STORE_NAME: mm, "x": xv}, {"x"})
    assert np.array_equal(out["y"], xv) and not np.shares_memory(out["y"], mm)
    mm.flush()
    assert path.read_bytes()[16:40] == xv.tobytes(), "the page went to the file"
    assert (trace.paged_in_bytes, trace.paged_out_bytes) == (24, 24)
    assert trace.timeline == (xv.nbytes, xv.nbytes), "x, then y (x died when paged out): the store is not RAM"
    with pytest.raises(VerificationError, match="overwrote it in place"):  # the store is threaded
        verify(g.replace(nodes=(g.nodes[0], Node("page_in", (store,), (y,), g.nodes[1].attrs))))
    with pytest.raises(VerificationError, match="do not lie in the store"):
        verify(g.replace(nodes=(Node("page_out", (store, x), (s1,), {"offset": 48}),)))
