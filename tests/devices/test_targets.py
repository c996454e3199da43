"""The target registry (devices/targets.py): one record per emit target, read by the C backend,
the firmware builder and the capability table."""
import pytest

from edgetrain.backends import capabilities
from edgetrain.backends import c as cbackend
from edgetrain.backends.c import cortexm
from edgetrain.devices import DEVICES, TARGETS, get_device, get_target


def test_every_target_has_a_cost_profile_and_a_capability_row():
    for name, t in TARGETS.items():
        assert t.name == name and t.device is DEVICES[t.profile]
        assert capabilities.backend_of_target(name) == t.backend
        if t.firmware:
            assert t.cpu and t.fpu and t.sram_bytes and t.flash_bytes


def test_cortex_m7_runs_on_the_m7_profile():
    assert get_target("cortex-m7").device.name == "m7"
    assert get_target("cortex-m4").device.name == "m4f"
    assert get_device("cortex-m7") is DEVICES["m7"]


def test_backends_read_the_registry():
    assert cbackend.TARGETS == tuple(TARGETS)
    assert set(cbackend.CORTEX_M_TARGETS) == set(cortexm.TARGETS) == {n for n, t in TARGETS.items() if t.firmware}
    assert cortexm.get_target("cortex-m4") is TARGETS["cortex-m4"]
    with pytest.raises(cortexm.CortexMError):
        cortexm.get_target("host")
    with pytest.raises(ValueError, match="unknown target"):
        get_target("cortex-m0")


def test_firmware_regions_come_from_the_target():
    files = cortexm.firmware_files("cortex-m7", ([[0.0]], [[0]]))
    t = TARGETS["cortex-m7"]
    assert "ram_bytes" not in files["link.ld"] and str(t.sram_bytes) in files["link.ld"]
    assert f"MACHINE = {t.machine}" in files["config.mk"] and f"CPU = {t.cpu}" in files["config.mk"]
