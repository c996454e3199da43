"""Run a job's pieces with the executor asked for: results appended to a file as they
arrive (`results.ResultsFile`), pieces already in that file skipped on a rerun, a progress
call per finished piece.

scale/ imports nothing of edgetrain (the bottom floor): the compiler's analyses (sparse/)
and the bench scripts both call down into it.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Mapping, Optional, Union

from .executor import Executor, SerialExecutor
from .ray_backend import RayExecutor
from .results import ResultsFile, ScaleError

#: the executor names `as_executor` understands (an Executor object is taken as it is)
EXECUTORS = ("serial", "ray")


def as_executor(executor: Union[None, str, Executor]) -> tuple[Executor, bool]:
    """(the executor, whether the caller owns it and must close it) for None or "serial"
    (in this process), "ray" (a local Ray started on demand) or an Executor, taken as it is
    and left open (`RayExecutor(address="HOST:PORT")` for a running cluster)."""
    if isinstance(executor, Executor):
        return executor, False
    if executor is None or executor == "serial":
        return SerialExecutor(), True
    if executor == "ray":
        return RayExecutor(), True
    raise ScaleError(f"executor must be one of {EXECUTORS} or an edgetrain.scale.Executor "
                     f"(RayExecutor(address=...) for a cluster), got {executor!r}")


def run_pieces(fn: Callable[[Any, Any], Any], shared: Any, pieces: Mapping[str, Any], *,
               executor: Union[None, str, Executor] = None, results: Union[None, str, os.PathLike] = None,
               job: str = "", progress: Optional[Callable[[str, Any], None]] = None) -> dict[str, Any]:
    """{key: fn(shared, pieces[key])} in the order of `pieces`, run by `executor`.

    With `results` (a path), every result is appended to that file as it arrives and a
    rerun with the same `job` (a text that names everything the results depend on besides
    the piece: model, data, settings) takes the pieces already there instead of running
    them again; keys are then texts and results JSON values (checked when written).
    `progress(key, result)` is called for each piece taken from the file, then for each as
    it finishes."""
    if not isinstance(pieces, Mapping):
        raise ScaleError(f"pieces must be a mapping key -> argument, got {type(pieces).__name__}")
    store = None if results is None else ResultsFile(results, job)
    out: dict[str, Any] = {}
    if store is not None:
        done = store.load()
        for key in pieces:
            if key in done:
                out[key] = done[key]
                if progress is not None:
                    progress(key, out[key])
    todo = {key: arg for key, arg in pieces.items() if key not in out}
    if todo:
        ex, owned = as_executor(executor)
        try:
            for key, value in ex.map(fn, shared, todo):
                if store is not None:
                    store.append(key, value)
                out[key] = value
                if progress is not None:
                    progress(key, value)
        finally:
            if owned:
                ex.close()
    missing = [key for key in pieces if key not in out]
    if missing:
        raise ScaleError(f"the executor returned no result for {len(missing)} pieces (first: {missing[0]!r})")
    return {key: out[key] for key in pieces}
