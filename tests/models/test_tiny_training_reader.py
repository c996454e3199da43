"""Reading tiny-training model files that are hostile or broken (issue 18, item 3).

A 611 KB archive holding a 600 MB member sent `from_tiny_training` to 1.4 GB; truncated and
bit-flipped archives raised raw UnicodeDecodeErrors. Now a declared size over the cap is
refused before anything of that size is allocated (measured with tracemalloc, which sees
Python's and numpy's allocations), and every corrupt file gives a ModelFileError naming it."""
from __future__ import annotations

import io
import pickle
import struct
import tracemalloc
import zipfile
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgetrain.models.tiny_training import TinyTrainingNet, from_tiny_training
from edgetrain.models.tiny_training_reader import MAX_MEMBER_BYTES, ModelFileError

from .tiny_training_file import ASSETS

try:
    from numpy._core.multiarray import _reconstruct
except ImportError:  # numpy 1
    from numpy.core.multiarray import _reconstruct

#: what reading one refused file may allocate at its peak: far below the sizes the files
#: declare (40 MB to 600 MB), above the few hundred KB the reading itself takes
PEAK_LIMIT_BYTES = 8 << 20
MEMBER = "archive/data.pkl"


def conv(rng, cin, cout, k, stride=1, groups=1) -> dict:
    return {"kernel_size": (k, k), "stride": stride, "groups": groups,
            "params": {"weight": rng.integers(-127, 128, (cout, cin // groups, k, k)).astype(np.int8),
                       "bias": rng.integers(-99, 100, cout).astype(np.int32),
                       "w_scales": np.full(cout, 0.01, np.float32),
                       "x_scale": 0.05, "x_zero": -128, "y_scale": 6 / 255, "y_zero": -128}}


def small_model() -> dict:
    """A tiny-training model dict in the published layout: conv, one depthwise-separable
    block, a classifier of 10 classes."""
    rng = np.random.default_rng(0)
    return {"first_conv": conv(rng, 3, 4, 3, stride=2),
            "blocks": [{"pointwise1": None, "depthwise": conv(rng, 4, 4, 3, groups=4),
                        "pointwise2": conv(rng, 4, 4, 1), "residual": None, "se": None}],
            "feature_mix": None, "classifier": conv(rng, 4, 10, 1)}


def archive(data: bytes) -> bytes:
    """A torch.save-like zip (stored members) holding `data` as its data.pkl."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr(MEMBER, data)
        z.writestr("archive/version", b"3\n")
    return buf.getvalue()


@pytest.fixture(scope="module")
def good_pickle() -> bytes:
    return pickle.dumps(small_model(), protocol=2)  # torch.save's protocol, as the real files


def refused(path, match: str) -> ModelFileError:
    """The ModelFileError reading `path` raises (it names the file), with the peak allocation
    of the attempt under PEAK_LIMIT_BYTES."""
    tracemalloc.start()
    try:
        with pytest.raises(ModelFileError, match=match) as info:
            from_tiny_training(path, num_classes=10)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(path) in str(info.value)
    assert peak < PEAK_LIMIT_BYTES, f"{peak:,} bytes allocated to refuse {path}"
    return info.value


def test_small_model_file_loads(tmp_path, good_pickle):
    path = tmp_path / "small.pkl"
    path.write_bytes(archive(good_pickle))
    net = from_tiny_training(path, num_classes=10)
    import torch

    assert net(torch.full((1, 3, 8, 8), 128.0)).shape == (1, 10)


def test_cap_is_far_above_the_real_models():
    files = sorted(ASSETS.glob("*.pkl"))
    if not files:
        pytest.skip(f"{ASSETS} holds no model files")
    for f in files:
        with zipfile.ZipFile(f) as z:
            largest = max(i.file_size for i in z.infolist())
        assert largest * 16 < MAX_MEMBER_BYTES, f
        assert isinstance(from_tiny_training(f, num_classes=10), TinyTrainingNet)


def test_member_declaring_more_than_the_cap_is_not_read(tmp_path):
    """A deflated member of zeros: 40 MB in a file of 40 KB (the issue's was 600 MB in 611 KB)."""
    path = tmp_path / "bomb.pkl"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr(MEMBER, bytes(MAX_MEMBER_BYTES + (8 << 20)))
    assert path.stat().st_size < 1 << 20
    err = refused(path, "declares 41,943,040 bytes")
    assert f"{MAX_MEMBER_BYTES:,} at most" in str(err)


def raw_zip(name: str, payload: bytes, declared: int, crc: int) -> bytes:
    """A one-member deflated zip whose headers declare `declared` bytes (whatever `payload`
    inflates to)."""
    n = name.encode()
    local = struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, 8, 0, 0, crc, len(payload), declared, len(n), 0) + n
    central = struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, 8, 0, 0, crc, len(payload), declared,
                          len(n), 0, 0, 0, 0, 0, 0) + n
    end = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 1, 1, len(central), len(local) + len(payload), 0)
    return local + payload + central + end


def test_member_inflating_past_its_declared_size_is_cut_there(tmp_path):
    """Headers that declare 1 KB over a stream of 40 MB: reading stops at the declared size."""
    big = bytes(MAX_MEMBER_BYTES + (8 << 20))
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    payload = c.compress(big) + c.flush()
    path = tmp_path / "liar.pkl"
    path.write_bytes(raw_zip(MEMBER, payload, 1024, zlib.crc32(big)))
    refused(path, "cannot read")


def _reduce_payload(func, args, state=None) -> bytes:
    class Payload:
        def __reduce__(self):
            return (func, args) if state is None else (func, args, state)

    return pickle.dumps({"first_conv": Payload()}, protocol=2)


PICKLES = {
    # an 8-byte length of 600 MB with 3 bytes behind it (the C unpickler allocates it first)
    "bytes8": b"\x80\x04\x8e" + struct.pack("<Q", 600 << 20) + b"abc.",
    "unicode8": b"\x80\x04\x8d" + struct.pack("<Q", 600 << 20) + b"abc.",
    "bytearray8": b"\x80\x05\x96" + struct.pack("<Q", 600 << 20) + b"abc.",
    # a memo index of 2**27: the C unpickler grows its memo to twice that (2 GB)
    "memo": b"\x80\x02Nr" + struct.pack("<I", 1 << 27) + b".",
    # numpy.ndarray called with a 600 MB shape
    "ndarray-call": _reduce_payload(np.ndarray, ((600 << 20,), "u1")),
    # numpy's array reconstruction asked for a 600 MB array
    "reconstruct": _reduce_payload(_reconstruct, (np.ndarray, (600 << 20,), b"b")),
    # an array's state claiming 10**9 floats with 3 bytes of data
    "state": _reduce_payload(_reconstruct, (np.ndarray, (0,), b"b"),
                             (1, (10 ** 9,), np.dtype("f4"), False, b"abc")),
    # an object array whose list is shorter than its shape (numpy 2.4 crashes on it)
    "object-array": _reduce_payload(_reconstruct, (np.ndarray, (0,), b"b"),
                                    (1, (10 ** 6,), np.dtype("O"), False, [1, 2])),
    "codec": _reduce_payload(__import__("_codecs").encode, ("x" * 10, "zlib_codec")),
    "os.system": _reduce_payload(__import__("os").system, ("touch pwned",)),
}


@pytest.mark.parametrize("name", sorted(PICKLES))
def test_hostile_pickles_are_refused_without_allocating(tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / f"{name}.pkl"
    path.write_bytes(archive(PICKLES[name]))
    refused(path, "refused to load|cannot read")
    assert not (tmp_path / "pwned").exists()


def loads_or_names_the_file(path) -> bool:
    """True if the file loads; False if it raises a ModelFileError naming it; any other
    exception propagates (the test fails)."""
    try:
        from_tiny_training(path, num_classes=10)
    except ModelFileError as err:
        assert str(path) in str(err), err
        return False
    return True


def test_truncated_archives(tmp_path, good_pickle):
    data = archive(good_pickle)
    path = tmp_path / "cut.pkl"
    for n in range(0, len(data), 7):
        path.write_bytes(data[:n])
        assert not loads_or_names_the_file(path), n


def test_bit_flips_in_the_archive(tmp_path, good_pickle):
    data = archive(good_pickle)
    path = tmp_path / "flipped.pkl"
    failed = 0
    for i in range(len(data)):
        flipped = bytearray(data)
        flipped[i] ^= 1 << (i % 8)
        path.write_bytes(bytes(flipped))
        failed += not loads_or_names_the_file(path)
    assert failed > len(data) // 2  # most flips are caught (CRC-32, headers); the rest are harmless


def test_bit_flips_in_the_pickle(tmp_path, good_pickle):
    """Flips inside data.pkl, re-zipped with a correct CRC: the unpickler meets them all."""
    path = tmp_path / "flipped.pkl"
    for i in range(len(good_pickle)):
        flipped = bytearray(good_pickle)
        flipped[i] ^= 1 << (i % 8)
        path.write_bytes(archive(bytes(flipped)))
        loads_or_names_the_file(path)


def test_truncated_pickles(tmp_path, good_pickle):
    path = tmp_path / "cut.pkl"
    for n in range(0, len(good_pickle), 3):
        path.write_bytes(archive(good_pickle[:n]))
        assert not loads_or_names_the_file(path), n


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(garbage=st.binary(max_size=600), zipped=st.booleans())
def test_garbage(tmp_path, garbage, zipped):
    path = tmp_path / "garbage.pkl"
    path.write_bytes(archive(garbage) if zipped else garbage)
    loads_or_names_the_file(path)
