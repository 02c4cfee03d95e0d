"""Thin adapters that put symmoe under the token dispatchers of training frameworks.

* ``symmoe.adapters.megatron``: Megatron-Core's flex token dispatcher (``_DispatchManager``,
  in place of its DeepEP manager);
* ``symmoe.adapters.torchtitan``: a TorchTitan expert-parallel token dispatcher
  (``dispatch`` / ``combine`` as ``RoutedExperts`` calls them).

Both sit on ``symmoe.Buffer`` and ``symmoe.autograd`` (so they carry gradients and inherit
the bitwise determinism), take the backend from a symmoe YAML config, and import no
framework code: neither framework is a dependency.
"""
