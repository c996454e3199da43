"""Beyond one machine (docs/scale.md): independent pieces of work (contribution analysis's
fine-tunes, budget and POET sweeps) run in this process or as Ray tasks, with their results
appended to a file as they arrive so a rerun skips what is done. Ray is optional
(`pip install -e ".[scale]"`) and imported only when used."""
from .executor import Executor, SerialExecutor
from .ray_backend import RayExecutor
from .results import ResultsFile, ScaleError
from .run import EXECUTORS, as_executor, run_pieces

__all__ = ["EXECUTORS", "Executor", "RayExecutor", "ResultsFile", "ScaleError", "SerialExecutor", "as_executor",
           "run_pieces"]
