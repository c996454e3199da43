"""An append-only results file: what a long job has finished, written as each piece arrives,
so that a job killed after hours loses only the pieces in flight and a rerun skips the rest.

The file is JSON lines. The first names the format and the job (a text that names what the
results depend on: model, data, settings); each further line is one piece,
`{"key": ..., "value": ...}`, written with one write, flushed and fsynced. Loading checks
all of it and refuses a file of another format or job, or a damaged line, with the reason;
only a last line cut short (the process was killed while writing it) is dropped, as that
piece never finished. One job writes a file at a time (the driver writes; pieces do not).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Union

FORMAT = "edgetrain-scale-results/1"


class ScaleError(ValueError):
    pass


class ResultsFile:
    """The results of one job at `path` (created on the first append)."""

    def __init__(self, path: Union[str, os.PathLike], job: str):
        if not isinstance(job, str):
            raise ScaleError(f"job must be a text naming what the results depend on, got {type(job).__name__}")
        self.path, self.job = Path(path), job

    def load(self) -> dict[str, Any]:
        """{key: value} of the finished pieces ({} when there is no file yet)."""
        if not self.path.exists():
            return {}
        if not self.path.is_file():
            raise ScaleError(f"results path {self.path} is not a file")
        raw = self.path.read_bytes()
        lines = raw.split(b"\n")
        if lines[-1]:  # a last line with no newline was being written when the process died: drop it
            with open(self.path, "r+b") as f:
                f.truncate(len(raw) - len(lines[-1]))
        lines = lines[:-1]
        if not lines:
            raise ScaleError(f"{self.path} is not an edgetrain results file (no header line): delete it or "
                             f"pass another path")
        header = self._parse(lines[0], 1)
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            raise ScaleError(f"{self.path} is not an edgetrain results file (expected format {FORMAT!r} on its "
                             f"first line): delete it or pass another path")
        if header.get("job") != self.job:
            raise ScaleError(f"{self.path} holds the results of another job (other model, data or settings: "
                             f"job {str(header.get('job'))[:24]!r}..., this one {self.job[:24]!r}...): delete it "
                             f"or pass another path")
        done: dict[str, Any] = {}
        for number, line in enumerate(lines[1:], start=2):
            row = self._parse(line, number)
            if not isinstance(row, dict) or set(row) != {"key", "value"} or not isinstance(row["key"], str):
                raise ScaleError(f"{self.path} line {number}: expected {{\"key\": text, \"value\": ...}}")
            done.setdefault(row["key"], row["value"])
        return done

    def append(self, key: str, value: Any) -> None:
        """Write one finished piece (and the header first, for a new file)."""
        if not isinstance(key, str):
            raise ScaleError(f"a piece saved to a results file needs a text key, got {type(key).__name__}")
        try:
            line = json.dumps({"key": key, "value": value}, allow_nan=False, separators=(",", ":"))
        except (TypeError, ValueError, RecursionError) as err:
            raise ScaleError(f"the result of piece {key!r} cannot be saved as JSON: {err}") from None
        if json.loads(line)["value"] != value:
            raise ScaleError(f"the result of piece {key!r} does not survive JSON (tuples or non-text keys?): "
                             f"return plain lists, dicts with text keys, numbers and texts")
        head = b""
        if not self.path.exists():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            head = (json.dumps({"format": FORMAT, "job": self.job}) + "\n").encode()
        with open(self.path, "ab") as f:
            f.write(head + line.encode() + b"\n")
            f.flush()
            os.fsync(f.fileno())

    def _parse(self, line: bytes, number: int) -> Any:
        try:
            return json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as err:  # a line nested 100k deep
            raise ScaleError(f"{self.path} line {number} is damaged ({err}): delete the file or pass another "
                             f"path") from None
