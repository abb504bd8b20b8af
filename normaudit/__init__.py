"""normaudit: audit the normalisation layers of PyTorch models.

Pipeline (one subpackage each): ``loaders`` (load the model, inputs, config, checkpoint) ->
``capture`` (torch.fx graph on fake tensors) -> ``facts`` (norm sites and what they compute) ->
``engine`` (declarative rules in ``rules/``) -> ``report`` (pydantic models) -> ``render``.
"""
__version__ = "0.1.0"

_LAZY = {"monitor": "normaudit.probes.monitor", "Monitor": "normaudit.probes.monitor",
         "NonFiniteEvent": "normaudit.probes.monitor", "NonFiniteError": "normaudit.probes.monitor"}


def __getattr__(name: str):
    """``normaudit.monitor`` and its classes, imported on first use so that ``import normaudit`` does not
    import torch (PEP 562 module ``__getattr__``)."""
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'normaudit' has no attribute {name!r}")
