"""Compat APIs: model code written for DeepEP runs on symmoe unchanged.

* ``symmoe.compat.deep_ep_v1`` -- DeepEP V1's ``Buffer`` (normal mode, intranode)
* ``symmoe.compat.deep_ep_v2`` -- DeepEP V2's ``ElasticBuffer`` (dispatch/combine)

Swap ``import deep_ep`` for ``import symmoe.compat.deep_ep_v1 as deep_ep`` (or ``_v2``) and
name the symmoe config once with ``set_default_config`` (or pass ``symmoe_config=`` to the
buffer). Each module's docstring lists what maps, what is ignored and what raises.
"""
from ._common import (CompatError, EventHandle, EventOverlap, Unavailable, UnsupportedArgument, UnsupportedCall,
                      set_default_config, topk_idx_t)

__all__ = ["CompatError", "UnsupportedArgument", "UnsupportedCall", "Unavailable", "EventOverlap", "EventHandle",
           "set_default_config", "topk_idx_t"]
