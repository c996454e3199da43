"""The Ray executor: each piece a Ray task, on a local Ray started on demand or on an
existing cluster (`address=`).

Ray is an optional extra (`pip install -e ".[scale]"`), imported only when a RayExecutor
first runs, so the serial path needs none of it. What is shared by all pieces goes to
Ray's object store once (`ray.put`); each task takes one CPU. A task whose worker process
dies (killed, out of memory, its node lost) is run again, up to `max_retries` times, by
Ray itself; an exception raised by the piece's own code is not retried (the piece is
deterministic: it would fail again) but raised here, and the pieces still running are
cancelled.
"""
from __future__ import annotations

import logging
import warnings
from typing import Any, Optional

from .executor import Executor
from .results import ScaleError

INSTALL = 'pip install -e ".[scale]"'
#: reruns of a piece whose worker died (Ray's own default for tasks)
DEFAULT_RETRIES = 3
#: CPUs a piece holds: pieces are single-threaded (a fine-tune sets one PyTorch thread)
CPUS_PER_PIECE = 1


def import_ray():
    """The ray module, or a ScaleError that says how to install it."""
    try:
        import ray
    except ImportError as err:
        raise ScaleError(f"the Ray executor needs Ray, an optional extra of edgetrain: {INSTALL} "
                         f"(or pip install ray); without it, leave executor at 'serial'") from err
    return ray


def _call(fn, shared, arg):
    return fn(shared, arg)


class RayExecutor(Executor):
    """Runs pieces as Ray tasks. `address`: None starts a local Ray (with `num_cpus`
    workers, default all cores) on first use and stops it on close(); "auto" or
    "HOST:PORT" connects to a running cluster (`ray start --head`) and leaves it running.
    A Ray this process already started or joined is used as it is, and left running."""

    def __init__(self, address: Optional[str] = None, *, num_cpus: Optional[int] = None,
                 max_retries: int = DEFAULT_RETRIES):
        if address is not None and (not isinstance(address, str) or not address):
            raise ScaleError(f"address must be None (a local Ray) or 'auto' or 'HOST:PORT', got {address!r}")
        if num_cpus is not None and (isinstance(num_cpus, bool) or not isinstance(num_cpus, int) or num_cpus < 1):
            raise ScaleError(f"num_cpus must be None or an int >= 1, got {num_cpus!r}")
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise ScaleError(f"max_retries must be an int >= 0, got {max_retries!r}")
        import_ray()  # without Ray, fail here, before any work, saying how to install it
        self.address, self.num_cpus, self.max_retries = address, num_cpus, max_retries
        self._started = False

    def _ray(self):
        ray = import_ray()
        if not ray.is_initialized():
            with warnings.catch_warnings():  # Ray's tip about GPU environment variables: no GPU is used
                warnings.filterwarnings("ignore", message="Tip: In future versions of Ray", category=FutureWarning)
                if self.address is None:
                    # "local": a new Ray of our own, never a cluster another process started on this machine
                    ray.init(address="local", num_cpus=self.num_cpus, include_dashboard=False,
                             log_to_driver=False, logging_level=logging.WARNING)
                else:
                    ray.init(address=self.address, log_to_driver=False, logging_level=logging.WARNING)
            self._started = True
        return ray

    def map(self, fn, shared, pieces):
        if not pieces:
            return
        ray = self._ray()
        task = ray.remote(num_cpus=CPUS_PER_PIECE, max_retries=self.max_retries)(_call)
        ref = ray.put(shared)
        pending = {task.remote(fn, ref, arg): key for key, arg in pieces.items()}
        try:
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1)
                for done in ready:
                    key = pending.pop(done)
                    yield key, self._get(ray, done, key)
        finally:
            for left in pending:
                ray.cancel(left, force=True)

    def _get(self, ray, ref, key) -> Any:
        try:
            return ray.get(ref)
        except ray.exceptions.WorkerCrashedError as err:
            raise ScaleError(f"piece {key!r}: its worker died {self.max_retries + 1} times "
                             f"(max_retries={self.max_retries}): {err}") from None

    def close(self) -> None:
        if self._started:
            import_ray().shutdown()
            self._started = False
