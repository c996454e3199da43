"""Softmax and log-softmax along one dim, with their gradients from the saved output."""
from __future__ import annotations

import numpy as np

from .base import OpDef, norm_dim, register


def _infer(ts, a):
    norm_dim(a["dim"], ts[0].rank)
    return [ts[0]]


def _softmax(x, dim):
    z = np.exp(x - x.max(axis=dim, keepdims=True))
    return z / z.sum(axis=dim, keepdims=True)


def _log_softmax(x, dim):
    z = x - x.max(axis=dim, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=dim, keepdims=True))


def _softmax_grad(xs, a):
    g, y = xs
    return [(y * (g - (g * y).sum(axis=a["dim"], keepdims=True))).astype(g.dtype)]


def _log_softmax_grad(xs, a):
    g, y = xs
    return [(g - np.exp(y) * g.sum(axis=a["dim"], keepdims=True)).astype(g.dtype)]


for _name, _fn, _grad in [("softmax", _softmax, _softmax_grad), ("log_softmax", _log_softmax, _log_softmax_grad)]:
    register(OpDef(_name, _infer, (lambda f: lambda xs, a: [f(xs[0], a["dim"]).astype(xs[0].dtype)])(_fn),
                   (lambda gname: lambda e, n, g, nd: [e.emit(gname, g[0], n.out, dim=n.attrs["dim"])])(_name + "_grad"),
                   num_inputs=(1, 1)))
    register(OpDef(_name + "_grad", lambda ts, a: [ts[0]], _grad, num_inputs=(2, 2)))
