"""Read the paper's int8 model files for architecture checks (a restricted unpickler:
only numpy array reconstruction is allowed; never a plain pickle load)."""
from __future__ import annotations

import importlib
import io
import pickle
import zipfile
from pathlib import Path

from edgetrain.data.assets import assets_setting

#: the shared assets as edgetrain finds them (EDGETRAIN_ASSETS, else shared/assets beside the
#: checkout); a path that does not exist when neither is there, so the tests that need it skip
ASSETS = (assets_setting()[0] or Path(__file__).resolve().parent / "no-shared-assets") / "tiny-training"
ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
           ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode"),
           ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar")}


class _Restricted(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) not in ALLOWED:
            raise pickle.UnpicklingError(f"{module}.{name} is not allowed in a model file")
        return getattr(importlib.import_module(module), name)


def load(name: str) -> dict:
    with zipfile.ZipFile(ASSETS / f"{name}.pkl") as z:
        member = next(n for n in z.namelist() if n.endswith("data.pkl"))
        return _Restricted(io.BytesIO(z.read(member))).load()


def convs_in_order(d: dict) -> list[dict]:
    out = [d["first_conv"]]
    for b in d["blocks"]:
        out += [c for c in (b["pointwise1"], b["depthwise"], b["pointwise2"]) if c is not None]
    return out + ([d["feature_mix"]] if d["feature_mix"] else [])
