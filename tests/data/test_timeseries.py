"""The UCR/UEA .ts reader (data/timeseries.py): the sets sktime's wheel ships, variable
lengths, missing values, and hostile files (each error names the file and line)."""
from __future__ import annotations

import re

import numpy as np
import pytest

from edgetrain.data import wheels
from edgetrain.data.mnist import DataError
from edgetrain.data.timeseries import (MAX_DIMENSIONS, TimeSeriesError, load_ts, load_ts_split, read_ts,
                                       split_files, ucr_dir)

needs_sktime = pytest.mark.skipif(not wheels.available("sktime"),
                                  reason="the UCR/UEA files come from the sktime 1.2.0 wheel "
                                         "(`python -m edgetrain.data.wheels`)")

HEADER = "#a comment\n@problemName Toy\n@timeStamps false\n@missing {missing}\n@univariate false\n" \
         "@dimensions 2\n@equalLength {equal}\n@classLabel true up down\n@data\n"


def _write(tmp_path, body, name="Toy_TRAIN.ts", missing="false", equal="false", header=None):
    p = tmp_path / name
    p.write_text((HEADER.format(missing=missing, equal=equal) if header is None else header) + body)
    return p


@needs_sktime
def test_basic_motions_shapes_classes_and_split():
    train, test = load_ts(ucr_dir("BasicMotions"))
    assert train.series.shape == test.series.shape == (40, 6, 100) and train.series.dtype == np.float32
    assert train.classes == ("Standing", "Running", "Walking", "Badminton") and train.problem == "BasicMotions"
    assert np.bincount(train.labels).tolist() == [10, 10, 10, 10] and train.labels.dtype == np.int64
    # the first value of the first case, as printed in the file
    assert train.series[0, 0, 0] == np.float32(0.079106)
    # a _TRAIN.ts file finds its _TEST.ts sibling; a set's name finds the installed files
    f, sibling = split_files(ucr_dir("BasicMotions") / "BasicMotions_TRAIN.ts")
    assert sibling is not None and sibling.name == "BasicMotions_TEST.ts"
    again = load_ts_split("BasicMotions", "test", limit=5)
    np.testing.assert_array_equal(again.series, test.series[:5])


@needs_sktime
def test_plaid_variable_lengths_padded_to_the_longest_or_cropped():
    train, test = load_ts("PLAID")
    longest = int(train.lengths.max())
    assert train.series.shape == (537, 1, longest) and test.series.shape[2] == longest  # test gets train's T
    short = int(np.argmin(train.lengths))
    n = int(train.lengths[short])
    assert n < longest and not train.series[short, 0, n:].any()  # zero padding after the series
    cropped = read_ts(ucr_dir("PLAID") / "PLAID_TRAIN.ts", length=64)
    assert cropped.series.shape == (537, 1, 64)
    np.testing.assert_array_equal(cropped.series, train.series[:, :, :64])


def test_missing_values_refused_or_filled(tmp_path):
    p = _write(tmp_path, "1,2,3:4,5,6:up\n1,?,3:4,5,6:down\n", missing="true")
    with pytest.raises(TimeSeriesError, match=re.escape(f"{p}:11 dimension 1: value 2 is missing")):
        read_ts(p)
    s = read_ts(p, missing=0.0)
    np.testing.assert_array_equal(s.series[1], [[1, 0, 3], [4, 5, 6]])
    assert s.labels.tolist() == [0, 1]


def test_unequal_lengths_and_explicit_length(tmp_path):
    p = _write(tmp_path, "1,2,3:4,5:up\n7:8,9,10,11:down\n")
    s = read_ts(p)
    assert s.series.shape == (2, 2, 4) and s.lengths.tolist() == [3, 4]
    np.testing.assert_array_equal(s.series[0], [[1, 2, 3, 0], [4, 5, 0, 0]])
    np.testing.assert_array_equal(read_ts(p, length=2).series[1], [[7, 0], [8, 9]])


@pytest.mark.parametrize("body,line,message", [
    ("1,2:3,4:up\n1,x2:3,4:up\n", 11, "dimension 1: value 2 is not a number: 'x2'"),
    ("1,2:3,4:sideways\n", 10, "class label 'sideways' is not one of @classLabel up down"),
    ("1,2:3,4:5,6:up\n", 10, "3 dimension(s); the header says 2"),
    ("1,2,3,4\n", 10, "no ':' before the label"),
    ("1,2:3,1e40:up\n", 10, "value 2 (1e40) is not a finite float32"),
    ("1,2:3,inf:up\n", 10, "is not a finite float32"),
])
def test_hostile_cases_name_the_line(tmp_path, body, line, message):
    p = _write(tmp_path, body)
    with pytest.raises(TimeSeriesError, match=re.escape(f"{p}:{line}") + ".*" + re.escape(message)):
        read_ts(p)


@pytest.mark.parametrize("header,message", [
    ("@dimensions 999999999\n@classLabel true a\n@data\n", f"@dimensions 999999999 is outside 1..{MAX_DIMENSIONS}"),
    ("@seriesLength -3\n@classLabel true a\n@data\n", "@seriesLength -3 is outside"),
    ("@timeStamps true\n", "time stamps"),
    ("@classLabel false\n@data\n", "need class labels"),
    ("@classLabel true a a\n@data\n", "distinct class names"),
    ("@colour red\n", "unknown header @colour"),
    ("@missing maybe\n", "@missing must be true or false"),
    ("@classLabel true a\n@classLabel true b\n", "@classLabel given twice"),
    ("@data\n1:a\n", "@data before @classLabel"),
    ("1,2:a\n", "expected a @header line or @data"),
    ("@classLabel true a\n", "no @data line"),
    ("@classLabel true a\n@data\n", "no cases after @data"),
])
def test_hostile_headers(tmp_path, header, message):
    p = _write(tmp_path, "", header=header)
    with pytest.raises(TimeSeriesError, match=re.escape(message)):
        read_ts(p)


def test_equal_length_declared_but_broken(tmp_path):
    header = "@equalLength true\n@seriesLength 3\n@classLabel true a\n@data\n"
    p = _write(tmp_path, "1,2,3:a\n1,2:a\n", header=header)
    with pytest.raises(TimeSeriesError, match=re.escape(f"{p}:6: [2] values; @equalLength true")):
        read_ts(p)


def test_binary_and_missing_files(tmp_path):
    p = tmp_path / "bad_TRAIN.ts"
    p.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(TimeSeriesError, match="not a text file"):
        read_ts(p)
    with pytest.raises(TimeSeriesError, match="no such .ts file"):
        load_ts(tmp_path / "nothing_TRAIN.ts")
    (tmp_path / "empty").mkdir()
    with pytest.raises(TimeSeriesError, match="found 0"):
        load_ts(tmp_path / "empty")  # a folder without a _TRAIN.ts


def test_folder_with_train_and_test_and_the_image_set_interface(tmp_path):
    _write(tmp_path, "1,2:3,4:up\n5,6:7,8:down\n")
    _write(tmp_path, "0,1:2,3,4:down\n", name="Toy_TEST.ts")
    train, test = load_ts(tmp_path)
    assert test.series.shape == (1, 2, 2)  # cropped to the training length
    np.testing.assert_array_equal(test.series[0], [[0, 1], [2, 3]])
    x = train.batch([1, 0], (2, 2), mean=(1.0, 2.0), std=(2.0,))
    np.testing.assert_array_equal(x, [[[2, 2.5], [2.5, 3]], [[0, 0.5], [0.5, 1]]])
    assert x.dtype == np.float32 and train.conversion((2, 1, 2)) is None
    with pytest.raises(TimeSeriesError, match="the model takes 3x5"):
        train.batch([0], (3, 5))
    assert train.fingerprint() != test.fingerprint() and len(train) == 2
    with pytest.raises(TimeSeriesError, match="no _TEST.ts"):
        (tmp_path / "Toy_TEST.ts").unlink()
        load_ts_split(tmp_path / "Toy_TRAIN.ts", "test")


def test_ucr_dir_unknown_set():
    if not wheels.available("sktime"):
        with pytest.raises(DataError, match="python -m edgetrain.data.wheels"):
            ucr_dir()
    else:
        with pytest.raises(DataError, match="no UCR/UEA set 'Nope'.*BasicMotions"):
            ucr_dir("Nope")


def test_load_images_reads_ts_sources_and_refuses_images_for_a_sequence_model(tmp_path):
    from edgetrain.data.folder import check_image_shape, load_images

    _write(tmp_path, "1,2:3,4:up\n5,6:7,8:down\n")
    _write(tmp_path, "0,1:2,3:down\n", name="Toy_TEST.ts")
    assert check_image_shape((1, 2, 2)) == (2, 1, 2)  # a sequence input (B, C, L)
    s = load_images(f"ts:{tmp_path}", (2, 1, 2), split="test")
    assert s.labels.tolist() == [1] and s.batch([0], (2, 1, 2)).shape == (1, 2, 2)
    assert len(load_images(f"ts:{tmp_path / 'Toy_TRAIN.ts'}", (2, 1, 2), limit=1)) == 1
    with pytest.raises(DataError, match="trains on time series: --data ts:PATH"):
        load_images(str(tmp_path), (2, 1, 2))
