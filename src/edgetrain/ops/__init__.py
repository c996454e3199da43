"""The op table: one OpDef per op, registered by the family modules imported here."""
from . import (conv, elementwise, embedding, linear, loss, norm, optim, page, pool, qconv, qelementwise,  # noqa: F401
               qfused, qgradupdate, qoptim, qpool, qstream, reduce, shape, softmax)
from .base import OPS, Cost, Emitter, OpDef, get_op
from .verify import VerificationError, verify

__all__ = ["OPS", "Cost", "Emitter", "OpDef", "VerificationError", "get_op", "verify"]
