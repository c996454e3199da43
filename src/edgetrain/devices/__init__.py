"""Device cost profiles for the remat / paging scheduler (POET's profiles, made consistent).

``get_device("a72")`` gives a profile; ``DEVICES`` holds them all; ``calibrate_host()`` measures this
machine. ``TARGETS`` (``targets``) is the registry of emit targets, each with its cost profile
(``get_target("cortex-m7").device`` is "m7"), memory regions, toolchain and QEMU machine.
Sources and the choices made where POET's profiles disagree: see ``profiles``.
"""
from .device import Device
from .profiles import ACTIVE_W, DEVICES
from .targets import TARGETS, Target, get_device, get_target

__all__ = ["ACTIVE_W", "DEVICES", "Device", "TARGETS", "Target", "calibrate_host", "get_device", "get_target"]


def __getattr__(name):
    """`calibrate_host` (numpy) is imported on first use: the CLI reads the target registry
    while it builds its parser, before any heavy import."""
    if name == "calibrate_host":
        from .calibrate import calibrate_host

        return calibrate_host
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
