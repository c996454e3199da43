"""Writes docs/backends.md from the capability table (run it after adding a kernel or an op;
tests/backends/test_capabilities.py fails while the page is out of date)."""
from pathlib import Path
from edgetrain.backends.capabilities import capability_markdown
head = """# What each backend runs

Every backend computes the same program: the reference runtime (numpy) is the spec, and the
C backend (a host library loaded with ctypes, or a Cortex-M firmware) is tested against it op
by op (`tests/ops/test_backends.py`: every op's forward and gradient on hypothesis-drawn
shapes, against torch) and model by model (`tests/backends/test_matrix.py`: every zoo model
x update scheme x dtype, reference against C). int8 results are equal bit for bit; a float32
result is within 1e-5 of each tensor's largest magnitude of the reference's, or, where a ReLU or
clamp decision lies within float32 rounding of its threshold (two summation orders can take
opposite sides of it, and that one mask bit moves every gradient upstream of the element), of a
float64 run of the same graph with the nearest such decisions taken the other way
(`tests/backends/c/kinks.py`): a kernel fault meets none of them.

The table below is `edgetrain.backends.capabilities.capability_markdown()`, the table the
compiler reads: a program with an op its backend lacks is refused by `et.compile(...,
backend="c")`, `prog.emit_c(...)` and `edgetrain compile` before any C is written or built
(`UnsupportedOpError`; exit 2 in the CLI), naming the op and the model source line it comes
from. `tests/backends/test_capabilities.py` fails when an op of the op table has no kernel
on a backend, or when this page differs from the table.

int8 programs run their quantized ops (`q*`: integer kernels, bit-exact with the reference)
and compute gradients in float32; float programs compute in float32 on the C backend
(float64 programs run on the reference backend only).

"""
(Path(__file__).resolve().parents[1] / "docs" / "backends.md").write_text(head + capability_markdown())
