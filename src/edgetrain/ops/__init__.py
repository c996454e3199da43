"""The op table: one OpDef per op, registered by the family modules imported here."""
from . import (compare, conv, elementwise, embedding, gather, linear, loss, norm, optim, pad, page, pool,  # noqa: F401
               qconv, qelementwise, qfused, qgradupdate, qoptim, qpool, qstream, reduce, shape, softmax)
from .base import OPS, Cost, Emitter, OpDef, get_op
from .verify import VerificationError, verify

__all__ = ["OPS", "Cost", "Emitter", "OpDef", "VerificationError", "get_op", "verify"]
