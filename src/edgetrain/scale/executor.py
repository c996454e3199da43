"""Run independent pieces of work in this process or on Ray, behind one interface.

A *piece* is one call `fn(shared, arg)` of a pure function: `shared` is what every piece
reads (a model and its data, sent once), `arg` what this piece does (one scheme to
fine-tune). Pieces are keyed and seeded by their caller, so where and in which order they
run changes nothing: an executor only decides where. `Executor.map` yields `(key, result)`
as each piece finishes (run.run_pieces adds the results file and progress on top).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Callable, Hashable, Iterator, Mapping


class Executor(ABC):
    """Maps a pure function over independent keyed pieces."""

    @abstractmethod
    def map(self, fn: Callable[[Any, Any], Any], shared: Any,
            pieces: Mapping[Hashable, Any]) -> Iterator[tuple[Hashable, Any]]:
        """Yield `(key, fn(shared, pieces[key]))` for every key, each as soon as it is done
        (the order is the executor's; a piece's result does not depend on it)."""

    def close(self) -> None:  # noqa: B027  a no-op by default, not abstract: the serial executor starts nothing
        """Give back what the executor started (nothing for the serial one)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class SerialExecutor(Executor):
    """The pieces one after another in this process, in the order given: the reference
    path, and the fastest on one core (a piece may reuse what the previous one computed
    in this process, e.g. a fine-tuner's cached features)."""

    def map(self, fn, shared, pieces):
        for key, arg in pieces.items():
            yield key, fn(shared, arg)
