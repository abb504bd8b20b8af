"""Static facts: passes that read the captured graph (and the model's modules, config and checkpoint) and
write typed facts onto :class:`normaudit.report.Site` / :class:`normaudit.report.ModelFacts`; graph-level
scratch data goes under ``node.meta["normaudit"]``, and the graph itself is never modified beyond that. Each
pass is one module (or a package of them): site discovery (:mod:`~normaudit.facts.sites`), axis labels
(:mod:`~normaudit.facts.axes`), placement on the residual stream (:mod:`~normaudit.facts.placement`), in-place
aliasing (:mod:`~normaudit.facts.aliasing`), formulas (:mod:`~normaudit.facts.formula`), BatchNorm and GroupNorm
facts (:mod:`~normaudit.facts.batchnorm`, :mod:`~normaudit.facts.frozen`), checkpoint weights
(:mod:`~normaudit.facts.weights`), static numerics bounds (:mod:`~normaudit.facts.numerics`), unused norms
(:mod:`~normaudit.facts.usage`) and eps (:mod:`~normaudit.facts.eps`). Their order is
:data:`normaudit.pipeline.PASSES`; every pass reads a :class:`~normaudit.facts.context.FactContext` and writes
into :class:`~normaudit.facts.context.Facts`.
"""
from normaudit.facts.context import FactContext, Facts  # noqa: F401 - what every pass reads and writes
