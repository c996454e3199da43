"""emit_c: a compiled program written as a C project for one emit target, after the
capability check (backends/capabilities.py). Apart from the package's __init__ because the
capability table reads this backend's kernel registry: the check sits above the kernels, the
package's __init__ below both."""
from __future__ import annotations

from pathlib import Path
from typing import Iterable, Optional, Union

from ...devices.targets import Target, resolve_target
from ..capabilities import check_program
from . import TARGETS
from .layout import GRAPHS, CBackendError


def emit_c(prog, out_dir, target: Union[str, Target] = "host", samples: Iterable = (), embed_weights: Optional[bool] = None,
           graphs: Optional[tuple] = None) -> Path:
    """Write `prog` as a C project into `out_dir` and return its path. target="host": model.c,
    model.h, runtime headers, Makefile (`make`: libmodel.so; with samples `make run` trains on
    them); a firmware target ("cortex-m4", "cortex-m7", "rv32imafc", "rv32imc", or a Target
    record): a firmware project (cortexm.py, weights `const` in flash). The name is resolved to
    its record here, once (devices.targets.resolve_target), and the record passed down.
    embed_weights (host): True compiles the initial weights in as array initializers (frozen
    ones `const`); False writes them to weights.bin with a standalone trainer reading it and
    samples.bin at run time (project.py, weights_file.py); None (default): embedded up to
    weights_file.EMBED_LIMIT_BYTES of state, a file above.
    graphs: which of "train", "forward" (et_predict) and "grad" (et_gradients) to emit, train
    included; by default all three on the host (the library's whole API) and ("train",) on a
    Cortex-M (its firmware trains; its arena is then the train graph's). The function of a
    graph left out is marked in model.h: calling it fails to compile, naming the graph.
    A program with an op the target lacks is refused (UnsupportedOpError) before anything is
    written (backends/capabilities.py)."""
    try:
        t = resolve_target(target)
    except ValueError:
        raise CBackendError(f"target={target!r}: use one of {TARGETS}") from None
    check_program(prog, t.backend)
    if t.name == "host":
        from .project import write_project

        return write_project(prog, out_dir, t.name, samples, embed_weights, graphs=graphs or GRAPHS)
    if t.firmware:
        from .cortexm import emit_firmware

        return emit_firmware(prog, out_dir, t, samples, graphs=graphs or ("train",))
    raise CBackendError(f"target={target!r}: use one of {TARGETS}")
