"""Device cost profiles for the remat / paging scheduler (POET's profiles, made consistent).

``get_device("a72")`` gives a profile; ``DEVICES`` holds them all; ``calibrate_host()`` measures this
machine. Sources and the choices made where POET's profiles disagree: see ``profiles``.
"""
from .calibrate import calibrate_host
from .device import Device
from .profiles import ACTIVE_W, DEVICES, get_device

__all__ = ["ACTIVE_W", "DEVICES", "Device", "calibrate_host", "get_device"]
