"""The in-place SGD update, optionally of a channel subset of the weight.

``sgd_update(w, g[, m]) -> (w'[, m'])`` with PyTorch's SGD semantics:
d = g + weight_decay·w;  m' = momentum·m + d;  w' = w − lr·m'  (m' = d without momentum).
With ``index`` set, only ``w`` restricted to those positions along ``dim`` is updated and
``g`` (and ``m``) have that restricted shape. The outputs overwrite w (and m) in place.
"""
from __future__ import annotations

import numpy as np

from .base import UPDATE_TAG, Cost, OpDef, register


def _selected_shape(w_shape, a):
    if a.get("index") is None:
        return tuple(w_shape)
    shape = list(w_shape)
    shape[a["dim"]] = len(a["index"])
    return tuple(shape)


def _infer(ts, a):
    w, g = ts[:2]
    want = _selected_shape(w.shape, a)
    if g.shape != want or any(t.shape != want for t in ts[2:]) or g.dtype != w.dtype:
        raise ValueError(f"sgd_update: gradient {g} does not match weight {w} (selected shape {want})")
    return [w] + list(ts[2:])


def _ref(xs, a):
    w, g = xs[:2]
    sel = (slice(None),) * a["dim"] + (np.asarray(a["index"]),) if a.get("index") is not None else ...
    wsel = w[sel]
    d = g + a["weight_decay"] * wsel if a["weight_decay"] else g
    outs = []
    if len(xs) > 2:
        d = a["momentum"] * xs[2] + d
    w_new = w.copy()
    w_new[sel] = wsel - a["lr"] * d
    outs.append(w_new.astype(w.dtype))
    if len(xs) > 2:
        outs.append(d.astype(w.dtype))
    return outs


register(OpDef("sgd_update", _infer, _ref, cost=lambda n: Cost(2 * n.inputs[1].type.numel,
                                                              3 * n.inputs[1].type.nbytes),
               shares=((0, 0), (1, 2)), mutates=True, num_inputs=(2, 3), tags={UPDATE_TAG}, gradient_operand=1))
