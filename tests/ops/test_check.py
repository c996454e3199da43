"""ops/check.py where its condition fails: the reference raises RunTimeCheckError with the
message, and so does the C backend's runner (kernels/check.py, runtime/et_check.h), the first
failed check of a chain in both; the op is a view of x (no bytes of its own) that dead-code
elimination keeps while the output is read through it. (Where it holds: the op table's case,
tests/ops/cases_check.py, against torch in test_ops.py and test_backends.py.)"""
from __future__ import annotations

import numpy as np
import pytest

from edgetrain.backends.c.graph_lib import build_graph_library, graph_layout
from edgetrain.backends.c.kernels.check import c_string
from edgetrain.interpreter import run_graph
from edgetrain.ir import Graph, TensorType, new_value
from edgetrain.ops import Emitter, verify
from edgetrain.ops.check import RunTimeCheckError
from edgetrain.passes import eliminate_dead_code

#: messages a C string literal must carry unchanged: quotes, a backslash, '??=' (a trigraph), UTF-8
MESSAGES = ('All examples must have the same number of <eos> tokens. (at "bart.py":1042 \\ ??=)',
            "la deuxième condition: x ≥ 0")


def chain(dtype: str = "float32"):
    """x -> check(ok0; MESSAGES[0]) -> check(ok1; MESSAGES[1]) -> output"""
    x = new_value(TensorType((2, 3), dtype), "x")
    oks = (new_value(TensorType((), "bool"), "ok0"), new_value(TensorType((1,), "int64"), "ok1"))
    e = Emitter()
    y = x
    for ok, message in zip(oks, MESSAGES):
        y = e.emit("check", y, ok, message=message)
    return verify(Graph((x, *oks), tuple(e.nodes), (y,), ("output",)))


#: (ok0, ok1) -> the message of the check that stops the program, None: none does
OUTCOMES = [((True, 1), None), ((False, 1), MESSAGES[0]), ((True, 0), MESSAGES[1]), ((False, 0), MESSAGES[0])]


def _feeds(ok0, ok1, dtype="float32"):
    x = (np.arange(6).reshape(2, 3) - 2).astype(dtype)
    return x, np.array(ok0), np.array([ok1], dtype=np.int64)


@pytest.mark.parametrize("oks, message", OUTCOMES)
def test_the_reference_raises_the_first_failed_checks_message(oks, message):
    x, ok0, ok1 = _feeds(*oks)
    run = lambda: run_graph(chain(), {"x": x, "ok0": ok0, "ok1": ok1})[0]["output"]  # noqa: E731
    if message is None:
        np.testing.assert_array_equal(run(), x)
        return
    with pytest.raises(RunTimeCheckError) as err:
        run()
    assert str(err.value) == message and isinstance(err.value, ValueError)


@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_the_c_backend_raises_the_same(dtype):
    run = build_graph_library(chain(dtype))
    for oks, message in OUTCOMES:
        feeds = _feeds(*oks, dtype=dtype)
        if message is None:
            np.testing.assert_array_equal(run(list(feeds))[0], feeds[0])
            continue
        with pytest.raises(RunTimeCheckError) as err:
            run(list(feeds))
        assert str(err.value) == message, oks
    np.testing.assert_array_equal(run(list(_feeds(True, 1, dtype)))[0], _feeds(True, 1, dtype)[0])  # (forgotten)


def test_c_strings_escape_what_c_would_read_otherwise():
    assert c_string('a"b\\c??=') == '"a\\"b\\\\c\\?\\?="'
    assert c_string("≥\n") == '"\\342\\211\\245\\012"'


def test_a_check_is_a_view_that_dead_code_elimination_keeps():
    g = chain()
    assert [n.op for n in eliminate_dead_code(g).nodes] == ["check", "check"]
    gl = graph_layout(g).graphs["run"]
    assert gl.roots[g.outputs[0]] is g.input("x")  # the output is x's storage: no bytes of its own
