"""Device profiles: every figure sane, the cost formulas, the calibration and the `profile` command."""
from __future__ import annotations

import dataclasses
import functools
import json
import math

import pytest

import edgetrain.devices as devices
from edgetrain.app.cli import main
from edgetrain.devices import ACTIVE_W, DEVICES, Device, calibrate_host, get_device
from edgetrain.devices import profiles

NUMBERS = [f.name for f in dataclasses.fields(Device) if f.type in ("int", "float")]


def _finite_positive(dev: Device):
    for f in NUMBERS:
        v = getattr(dev, f)
        assert math.isfinite(v) and v > 0, (dev.name, f, v)


@pytest.mark.parametrize("name", list(DEVICES))
def test_profile_positive_and_finite(name):
    dev = DEVICES[name]
    assert dev.name == name and dev.title
    _finite_positive(dev)
    assert dev.weights_in_flash == (name in ("m0", "m4f", "m7"))


def test_the_six_profiles_and_their_ram():
    assert list(DEVICES) == ["m0", "m4f", "m7", "a72", "tx2", "host"]
    kib, gib = 1024, 1024**3
    assert [DEVICES[n].ram_bytes for n in ("m0", "m4f", "m7", "a72", "tx2")] == \
        [32 * kib, 256 * kib, 320 * kib, 4 * gib, 8 * gib]


@pytest.mark.parametrize("name", list(DEVICES))
def test_energy_follows_from_one_active_power(name):
    dev, watts = DEVICES[name], ACTIVE_W[name]
    assert dev.flops_per_j == pytest.approx(dev.flops_per_s / watts, rel=1e-12)
    assert dev.mem_j_per_byte == pytest.approx(watts / dev.mem_bytes_per_s, rel=1e-12)


def test_a72_throughput_and_energy_agree():
    a72 = get_device("a72")
    assert a72.flops_per_s == 2e9 and ACTIVE_W["a72"] == 3.0      # POET's FLOPS and 600 mA at 5 V
    assert a72.flops_per_j == pytest.approx(2e9 / 3.0)


def test_tx2_has_compute_figures_from_the_gpu():
    tx2 = get_device("tx2")
    assert tx2.flops_per_s == pytest.approx(256 * 2 * 854e6 * 0.5)
    assert tx2.flops_per_j == pytest.approx(tx2.flops_per_s / 7.5)
    assert tx2.flops_per_s > get_device("a72").flops_per_s > get_device("m7").flops_per_s


def test_poet_figures_kept():
    m0, m4f = get_device("m0"), get_device("m4f")
    assert m0.flops_per_s == pytest.approx(1.67e5, rel=0.01) and m0.flops_per_j == pytest.approx(2.53e6, rel=0.01)
    assert m4f.flops_per_s == pytest.approx(6.37e6, rel=0.01) and m4f.flops_per_j == pytest.approx(5.80e8, rel=0.01)
    for n in ("m0", "m4f", "m7"):
        d = get_device(n)
        assert (d.page_in_bytes_per_s, d.page_out_bytes_per_s, d.storage_w) == (4616.51e3, 4440e3, 0.33)
    a72, tx2 = get_device("a72"), get_device("tx2")
    assert (a72.page_in_bytes_per_s, a72.page_out_bytes_per_s, a72.storage_w) == (45.5e6, 24.5e6, 0.15)
    assert (tx2.page_in_bytes_per_s, tx2.page_out_bytes_per_s, tx2.storage_w) == (108.5e6, 94.37e6, 0.309)
    assert tx2.page_latency_s < a72.page_latency_s      # eMMC answers faster than the Pi's SD card


def test_roofline_and_page_formulas():
    d = Device("t", "test", 1000, flops_per_s=100.0, flops_per_j=10.0, mem_bytes_per_s=50.0,
               mem_j_per_byte=0.5, page_in_bytes_per_s=4.0, page_out_bytes_per_s=2.0, page_latency_s=0.25,
               storage_w=3.0, weights_in_flash=False)
    assert d.node_time_s(macs=100, nbytes=10) == pytest.approx(2.0)      # compute-bound: 200 FLOP / 100
    assert d.node_time_s(macs=1, nbytes=500) == pytest.approx(10.0)      # memory-bound: 500 B / 50
    assert d.node_time_s(0, 0) == 0.0
    assert d.node_energy_j(macs=100, nbytes=10) == pytest.approx(200 / 10 + 10 * 0.5)
    assert d.page_in_s(8) == pytest.approx(0.25 + 2.0)
    assert d.page_out_s(8) == pytest.approx(0.25 + 4.0)
    assert d.page_in_j(8) == pytest.approx(2.25 * 3.0)
    assert d.page_out_j(8) == pytest.approx(4.25 * 3.0)
    assert d.page_in_s(0) == d.page_latency_s


@pytest.mark.parametrize("name", list(DEVICES))
def test_costs_grow_with_work(name):
    d = DEVICES[name]
    for f in (d.page_in_s, d.page_out_s, d.page_in_j, d.page_out_j):
        assert 0 < f(1) < f(10**6)
    assert d.node_time_s(10, 10) <= d.node_time_s(10**6, 10**6)
    assert d.node_energy_j(10, 10) < d.node_energy_j(10**6, 10**6)


def test_device_is_frozen_and_validated():
    d = get_device("m4f")
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.ram_bytes = 1
    with pytest.raises(ValueError, match="page_latency_s"):
        dataclasses.replace(d, page_latency_s=-1.0)
    with pytest.raises(ValueError, match="flops_per_s"):
        dataclasses.replace(d, flops_per_s=math.inf)


def test_get_device():
    assert get_device("A72 ") is DEVICES["a72"]
    d = dataclasses.replace(DEVICES["m7"], name="mine")
    assert get_device(d) is d
    for bad in ("pi5", "", 3, None):
        with pytest.raises(ValueError) as err:
            get_device(bad)
        msg = str(err.value)
        assert "unknown device" in msg and all(n in msg for n in DEVICES)


def test_describe_and_dict_cover_every_field():
    d = get_device("a72")
    assert set(d.as_dict()) == {f.name for f in dataclasses.fields(Device)}
    text = d.describe()
    assert "Raspberry Pi 4B" in text and "45.5 MB/s" in text and "2 ms" in text
    assert len(text.splitlines()) == len(dataclasses.fields(Device))


def test_calibrate_host_is_sane(tmp_path):
    h = calibrate_host(seconds=0.2, directory=tmp_path)
    assert h.name == "host-calibrated" and not h.weights_in_flash
    _finite_positive(h)
    assert 1e7 < h.flops_per_s < 1e14
    assert 1e7 < h.mem_bytes_per_s < 1e13
    assert 1e3 < h.page_in_bytes_per_s < 1e12 and 1e3 < h.page_out_bytes_per_s < 1e12
    assert h.page_latency_s < 1.0
    assert h.flops_per_j == pytest.approx(h.flops_per_s / profiles.HOST_W)
    assert list(tmp_path.iterdir()) == []                       # the temp file is gone
    with pytest.raises(ValueError, match="seconds"):
        calibrate_host(seconds=0)


def test_storage_fit_keeps_a_slope_only_where_the_times_resolve_it():
    from edgetrain.devices.calibrate import _fit
    # 1 ms latency, 1 GB/s: the 4 MB operation takes 5.2 ms, far outside the 0.1 ms jitter
    lat, bw = _fit(4096, [1.003e-3, 1.004e-3, 1.005e-3], 4 * 2**20, [5.09e-3, 5.2e-3, 5.3e-3])
    assert bw == pytest.approx((4 * 2**20 - 4096) / (5.2e-3 - 1.004e-3))
    assert lat == pytest.approx(1.004e-3 - 4096 / bw)
    # a loaded machine: the two medians 1 us apart with 0.5 ms of jitter. The slope would say 4 TB/s;
    # the fit says no more than the large operation's own rate
    small, large = [0.6e-3, 1.0e-3, 1.4e-3], [0.7e-3, 1.001e-3, 1.5e-3]
    lat, bw = _fit(4096, small, 4 * 2**20, large)
    assert bw == pytest.approx(4 * 2**20 / 1.001e-3) and lat == pytest.approx(1.0e-3)
    # the large operation faster than the small one
    lat, bw = _fit(4096, [2e-3] * 3, 4 * 2**20, [1e-3] * 3)
    assert bw == pytest.approx(4 * 2**20 / 1e-3) and lat == pytest.approx(2e-3)


@pytest.mark.parametrize("name", list(DEVICES))
def test_cli_profile_json(name, capsys):
    assert main(["profile", "--device", name, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == DEVICES[name].as_dict()


def test_cli_profile_text_default_host(capsys):
    assert main(["profile"]) == 0
    assert "generic x86-64 laptop" in capsys.readouterr().out


def test_cli_profile_calibrate(monkeypatch, capsys):
    monkeypatch.setattr(devices, "calibrate_host", functools.partial(calibrate_host, seconds=0.2))
    assert main(["profile", "--calibrate", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["name"] == "host-calibrated" and out["flops_per_s"] > 0


def test_cli_profile_unknown_device(capsys):
    assert main(["profile", "--device", "pi5"]) == 2
    err = capsys.readouterr().err
    assert "edgetrain profile: error: unknown device 'pi5'" in err and "a72" in err and "tx2" in err
