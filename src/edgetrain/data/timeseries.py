"""Labelled time series in the UCR/UEA `.ts` format (sensor learning: IMU, currents, ...).

    s = read_ts("BasicMotions_TRAIN.ts")              # float32 (N, dims, T), int64 labels
    train, test = load_ts("ts-dir-or-TRAIN-file")     # the _TEST.ts sibling (None when absent)
    s = load_ts_split(ucr_dir("BasicMotions"), "test")

The format (https://www.timeseriesclassification.com, sktime's `load_from_tsfile`): `#`
comments, a header of `@key value` lines (@problemName, @timeStamps, @missing, @univariate,
@dimensions, @equalLength, @seriesLength, @classLabel true LABEL..., then @data), and one case
a line: the dimensions separated by ':', each a ','-separated list of values, the class label
last. `?` (or NaN) is a missing value: refused unless `missing=` gives the value that fills it.

Length: every series becomes `length` samples: shorter ones are padded with zeros at the end,
longer ones cropped to their first `length` samples. The default `length` is the header's
@seriesLength, else the longest series in the file (so nothing is cropped by default); a test
split read with `load_ts` gets its training split's length. Classes are numbered in the
order the header's @classLabel lists them.

The UCR/UEA sets the sktime 1.2.0 wheel ships (BasicMotions, PLAID, ArrowHead, ...) are found
with `ucr_dir(name)` in the installed package, or straight inside the wheel when it is not
installed (`python -m edgetrain.data.wheels`; data/wheels.py); sktime itself is never imported
(its dependencies need not be installed). Paths may be `pathlib.Path`s or folders and files
inside the wheel (`zipfile.Path`)."""
from __future__ import annotations

import hashlib
import math
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np

from .errors import DataError
from .wheels import DataDir, data_dir

#: the package holding the UCR/UEA files, and the folder inside it
UCR_PACKAGE, UCR_SUBDIR = "sktime", ("datasets", "data")
#: hostile-header guards: the largest UEA archive set has 1345 dimensions (DuckDuckGeese) and
#: the longest series ~18k samples (EigenWorms); ten times that is still a legitimate file
MAX_DIMENSIONS, MAX_LENGTH = 16_384, 262_144
#: at most this many float32 values in one set (1 GiB), checked before the array is allocated
MAX_VALUES = 1 << 28
MISSING_TOKENS = ("?", "nan")
TRUE, FALSE = "true", "false"
#: header keys this reader knows; any other @key is refused (a typo would silently change the data)
KNOWN_KEYS = ("problemname", "timestamps", "missing", "univariate", "dimensions", "equallength",
              "serieslength", "classlabel", "targetlabel", "data")


class TimeSeriesError(DataError):
    """A .ts file cannot be read as it is (the message names the file and line)."""


@dataclass
class TimeSeriesSet:
    """float32 series (N, dims, T), int64 labels, the class names in the header's order, the
    original length of each case, and where they are from. It also has ImageSet's interface
    (`images`, `batch`, `conversion`, `fingerprint`) so that `edgetrain train --data ts:PATH`
    draws batches from it as from images."""

    series: np.ndarray
    labels: np.ndarray
    classes: tuple[str, ...]
    source: str
    lengths: np.ndarray
    problem: str = ""
    skipped: tuple[str, ...] = ()
    files: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def images(self) -> np.ndarray:
        return self.series

    @property
    def shape(self) -> tuple[int, int]:
        """(dims, T) of one case."""
        return int(self.series.shape[1]), int(self.series.shape[2])

    def conversion(self, shape) -> Optional[str]:
        """None: series are never converted; `batch` refuses a model input of another size."""
        return None

    def batch(self, index: Sequence[int], shape=None, mean=(0.0,), std=(1.0,)) -> np.ndarray:
        """Cases `index` as float32 (len(index), dims, T), (x - mean) / std per dimension (one
        value for all, or one per dimension). `shape`, when given, is the model's per-case input
        (dims, T) or (dims, 1, T) and must match."""
        if shape is not None and tuple(s for s in shape if s != 1) != tuple(s for s in self.shape if s != 1):
            raise TimeSeriesError(f"{self.source}: cases are {self.shape[0]} dimension(s) x {self.shape[1]} samples; "
                                  f"the model takes {'x'.join(map(str, shape))}")
        x = self.series[np.asarray(index, dtype=np.int64)]
        m = np.asarray(mean, dtype=np.float32).reshape(-1, 1)
        s = np.asarray(std, dtype=np.float32).reshape(-1, 1)
        return ((x - m) / s).astype(np.float32)

    def fingerprint(self) -> str:
        """sha256 of the values and labels (what a resumed run must train on again)."""
        h = hashlib.sha256()
        h.update(np.ascontiguousarray(self.series).tobytes())
        h.update(np.ascontiguousarray(self.labels).tobytes())
        return h.hexdigest()

    def subset(self, index: Sequence[int]) -> "TimeSeriesSet":
        index = np.asarray(index, dtype=np.int64)
        return TimeSeriesSet(self.series[index], self.labels[index], self.classes, self.source, self.lengths[index],
                             self.problem)


@dataclass
class _Header:
    values: dict
    dims: Optional[int] = None
    length: Optional[int] = None
    classes: tuple[str, ...] = ()


def as_path(path) -> DataDir:
    """`path` as a Path, a folder or file inside a wheel (zipfile.Path) kept as it is."""
    return path if isinstance(path, zipfile.Path) else Path(path)


def _train_files(folder: DataDir) -> list:
    """The NAME_TRAIN.ts files in `folder`, sorted by name."""
    return sorted((f for f in folder.iterdir() if f.name.endswith("_TRAIN.ts")), key=lambda f: f.name)


def ucr_dir(name: Optional[str] = None) -> DataDir:
    """The folder of the UCR/UEA sets in the sktime wheel, installed or not (`name`: one set's folder)."""
    root = data_dir(UCR_PACKAGE, *UCR_SUBDIR)
    if name is None:
        return root
    if not (root / name).is_dir():
        known = sorted(p.name for p in root.iterdir() if p.is_dir() and _train_files(p))
        raise DataError(f"no UCR/UEA set {name!r} in {root}; there: {', '.join(known)}")
    return root / name


def _flag(value: str, key: str, where: str) -> bool:
    v = value.lower()
    if v not in (TRUE, FALSE):
        raise TimeSeriesError(f"{where}: @{key} must be true or false, got {value!r}")
    return v == TRUE


def _count(value: str, key: str, limit: int, where: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise TimeSeriesError(f"{where}: @{key} must be a whole number, got {value!r}") from None
    if not 1 <= n <= limit:
        raise TimeSeriesError(f"{where}: @{key} {n} is outside 1..{limit}")
    return n


def _header_line(h: _Header, line: str, where: str) -> None:
    written, _, rest = line[1:].replace("\t", " ").partition(" ")
    key, rest = written.lower(), rest.strip()  # keys are case-insensitive; messages say them as written
    if key not in KNOWN_KEYS:
        raise TimeSeriesError(f"{where}: unknown header @{written}")
    if key in h.values:
        raise TimeSeriesError(f"{where}: @{written} given twice")
    h.values[key] = rest
    if key == "timestamps" and _flag(rest, written, where):
        raise TimeSeriesError(f"{where}: series with time stamps ((t, v) pairs) are not supported")
    elif key in ("missing", "univariate", "equallength"):
        _flag(rest, written, where)
    elif key == "dimensions":
        h.dims = _count(rest, written, MAX_DIMENSIONS, where)
    elif key == "serieslength":
        h.length = _count(rest, written, MAX_LENGTH, where)
    elif key == "targetlabel" and _flag(rest.split()[0] if rest else "", written, where):
        raise TimeSeriesError(f"{where}: a regression set (@targetLabel true); only class labels are supported")
    elif key == "classlabel":
        words = rest.split()
        if not words or not _flag(words[0], written, where):
            raise TimeSeriesError(f"{where}: the cases need class labels (@classLabel true LABEL ...)")
        h.classes = tuple(words[1:])
        if not h.classes or len(set(h.classes)) != len(h.classes):
            raise TimeSeriesError(f"{where}: @classLabel true needs distinct class names, got {rest!r}")


def _values(text: str, where: str, fill: Optional[float]) -> np.ndarray:
    tokens = [t.strip() for t in text.split(",")]
    out = np.empty(len(tokens), dtype=np.float64)
    for i, t in enumerate(tokens):
        if t.lower() in MISSING_TOKENS:
            if fill is None:
                raise TimeSeriesError(f"{where}: value {i + 1} is missing ({t!r}); pass missing=VALUE to fill it")
            out[i] = fill
            continue
        try:
            out[i] = float(t)
        except ValueError:
            raise TimeSeriesError(f"{where}: value {i + 1} is not a number: {t[:40]!r}") from None
        if not math.isfinite(out[i]) or abs(out[i]) > np.finfo(np.float32).max:
            raise TimeSeriesError(f"{where}: value {i + 1} ({t[:40]}) is not a finite float32")
    return out


def read_ts(path, length: Optional[int] = None, missing: Union[None, float] = None) -> TimeSeriesSet:
    """One .ts file: every series zero-padded or cropped to `length` (default: the header's
    @seriesLength, else the longest series); missing values refused, or set to `missing`."""
    path = as_path(path)
    if not path.is_file():
        raise TimeSeriesError(f"{path}: no such .ts file")
    if length is not None:
        length = _count(str(length), "length", MAX_LENGTH, f"{path}: length=")
    fill = None if missing is None else float(missing)
    if fill is not None and not math.isfinite(fill):
        raise TimeSeriesError(f"missing={missing!r}: the fill value must be a finite number")
    h, cases, labels = _Header({}), [], []
    with path.open("r", encoding="utf-8", errors="strict") as f:
        try:
            lines = f.read().splitlines()
        except UnicodeDecodeError as err:
            raise TimeSeriesError(f"{path}: not a text file ({err.reason} at byte {err.start})") from None
    in_data = False
    for number, raw in enumerate(lines, 1):
        line, where = raw.strip(), f"{path}:{number}"
        if not line or line.startswith("#"):
            continue
        if not in_data:
            if not line.startswith("@"):
                raise TimeSeriesError(f"{where}: expected a @header line or @data, got {line[:40]!r}")
            _header_line(h, line, where)
            in_data = line.lower().split()[0] == "@data"
            if in_data and not h.classes:
                raise TimeSeriesError(f"{where}: @data before @classLabel true LABEL ... (the cases need labels)")
            continue
        *parts, label = line.split(":")
        if not parts:
            raise TimeSeriesError(f"{where}: a case is DIM[:DIM...]:LABEL; no ':' before the label")
        label = label.strip()
        if label not in h.classes:
            raise TimeSeriesError(f"{where}: class label {label[:40]!r} is not one of @classLabel "
                                  f"{' '.join(h.classes)}")
        dims = h.dims or (1 if h.values.get("univariate", "").lower() == TRUE else len(parts))
        if len(parts) != dims:
            raise TimeSeriesError(f"{where}: {len(parts)} dimension(s); the header says {dims}")
        if len(parts) > MAX_DIMENSIONS:
            raise TimeSeriesError(f"{where}: {len(parts)} dimensions (at most {MAX_DIMENSIONS})")
        series = [_values(p, f"{where} dimension {d + 1}", fill) for d, p in enumerate(parts)]
        longest = max(len(s) for s in series)
        if longest > MAX_LENGTH:
            raise TimeSeriesError(f"{where}: a series of {longest} values (at most {MAX_LENGTH})")
        if h.values.get("equallength", "").lower() == TRUE and h.length and any(len(s) != h.length for s in series):
            raise TimeSeriesError(f"{where}: {[len(s) for s in series]} values; @equalLength true and "
                                  f"@seriesLength {h.length}")
        cases.append(series)
        labels.append(h.classes.index(label))
        if h.dims is None:
            h.dims = dims
    if not in_data:
        raise TimeSeriesError(f"{path}: no @data line")
    if not cases:
        raise TimeSeriesError(f"{path}: no cases after @data")
    lengths = np.array([max(len(s) for s in c) for c in cases], dtype=np.int64)
    t = length or h.length or int(lengths.max())
    if len(cases) * h.dims * t > MAX_VALUES:
        raise TimeSeriesError(f"{path}: {len(cases)} cases x {h.dims} dimensions x {t} samples exceed "
                              f"{MAX_VALUES} values")
    x = np.zeros((len(cases), h.dims, t), dtype=np.float32)
    for i, c in enumerate(cases):
        for d, s in enumerate(c):
            x[i, d, :min(len(s), t)] = s[:t]
    return TimeSeriesSet(x, np.array(labels, dtype=np.int64), h.classes, str(path), lengths,
                         h.values.get("problemname", os.path.splitext(path.name)[0]))


def split_files(path) -> tuple[DataDir, Optional[DataDir]]:
    """(the _TRAIN.ts file, its _TEST.ts sibling or None) of a _TRAIN.ts file or of a folder
    holding exactly one NAME_TRAIN.ts."""
    path = as_path(path)
    if path.is_dir():
        found = _train_files(path)
        if len(found) != 1:
            raise TimeSeriesError(f"{path}: a time series folder holds one NAME_TRAIN.ts (and NAME_TEST.ts); "
                                  f"found {len(found)}")
        path = found[0]
    elif not path.is_file():
        raise TimeSeriesError(f"{path}: no such .ts file or folder")
    if not path.name.endswith("_TRAIN.ts"):
        return path, None
    test = path.parent / (path.name[:-len("_TRAIN.ts")] + "_TEST.ts")
    return path, test if test.is_file() else None


def resolve(spec) -> DataDir:
    """A path as given, or the name of a UCR/UEA set in the sktime wheel (`ucr_dir`)."""
    if isinstance(spec, zipfile.Path):
        return spec
    p = Path(spec)
    if p.exists() or "/" in str(spec) or str(spec).endswith(".ts"):
        return p
    return ucr_dir(str(spec))


def load_ts(path, length: Optional[int] = None, missing=None) -> tuple[TimeSeriesSet, Optional[TimeSeriesSet]]:
    """(train, test) of a _TRAIN.ts file, a folder holding one, or a set's name (`ucr_dir`); the
    test split (None without a _TEST.ts sibling) is padded/cropped to the training length, and
    must have the same classes."""
    train_file, test_file = split_files(resolve(path))
    train = read_ts(train_file, length, missing)
    if test_file is None:
        return train, None
    test = read_ts(test_file, train.series.shape[2], missing)
    if test.classes != train.classes or test.shape[0] != train.shape[0]:
        raise TimeSeriesError(f"{test_file}: classes {test.classes} / {test.shape[0]} dimensions differ from "
                              f"{train_file}'s {train.classes} / {train.shape[0]}")
    return train, test


def load_ts_split(path, split: str = "train", limit: Optional[int] = None, length: Optional[int] = None,
                  missing=None) -> TimeSeriesSet:
    """One split ("train" or "test") of `load_ts`, its first `limit` cases when given."""
    if split not in ("train", "test"):
        raise DataError(f"split must be train or test, got {split!r}")
    train, test = load_ts(path, length, missing)
    s = train if split == "train" else test
    if s is None:
        raise TimeSeriesError(f"{path}: no _TEST.ts file beside the _TRAIN.ts file for the test split")
    if limit is not None:
        if limit < 1:
            raise DataError(f"limit must be a positive number of cases, got {limit}")
        s = s.subset(range(min(limit, len(s))))
    return s


def test_split_of(data: str) -> Optional[str]:
    """`data` itself (ts:PATH, read with split="test") when PATH has a _TEST.ts split, else None."""
    try:
        return data if split_files(resolve(data[len("ts:"):]))[1] is not None else None
    except DataError:
        return None
