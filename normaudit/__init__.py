"""normaudit: audit the normalisation layers of PyTorch models.

Pipeline (one subpackage each): ``target`` (load the model, inputs, config, checkpoint) ->
``capture`` (torch.fx graph on fake tensors) -> ``facts`` (norm sites and what they compute) ->
``engine`` (declarative rules in ``rules/``) -> ``report`` (pydantic models) -> ``render``.
"""
__version__ = "0.1.0"
