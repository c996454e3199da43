"""The op table: one OpDef per op, registered by the family modules imported here."""
from . import (bnact, bnfused, check, compare, conv, conv_nd, elementwise, embedding, embedding_update,  # noqa: F401
               gather, gradupdate, groupnorm, icross_entropy, igrad, linear, lmloss, loss, norm, optim, page, pad,
               pointwise, pool, pool_nd, qconv, qconv_transpose, qelementwise, qfused, qgradupdate, qoptim, qpointwise, qpool, qresample, qstream,
               qweights, reduce, resample, select, shape, softmax)
from .base import (ACTIVATION_TAG, GRAD_MASK_TAG, LAYER_TAG, NORM_TAG, OPS, SAME_SCALE_TAG, TAGS, UPDATE_TAG, WHOLE,
                   ChannelSelect, Cost, Emitter, Int8Rule, OpDef, ParamOperands, Wanted, Whole, get_op, ops_tagged)
from .verify import VerificationError, verify

__all__ = ["ACTIVATION_TAG", "GRAD_MASK_TAG", "LAYER_TAG", "NORM_TAG", "OPS", "SAME_SCALE_TAG", "TAGS", "UPDATE_TAG",
           "WHOLE", "ChannelSelect", "Cost", "Emitter", "Int8Rule", "OpDef", "ParamOperands", "VerificationError",
           "Wanted", "Whole", "get_op", "ops_tagged", "verify"]
