"""Placement of each norm on the residual stream (pre-LN, post-LN, sandwich, final, ...) and the residual-norm
scheme of the model.

Pre-LN vs post-LN is a Transformer design choice, not part of the LayerNorm paper: post-LN in
Vaswani et al. 2017 ("Attention Is All You Need", arXiv 1706.03762, ``LayerNorm(x + Sublayer(x))``),
pre-LN analysed by Xiong et al. 2020 (arXiv 2002.04745, ``x + Sublayer(LayerNorm(x))`` plus a final
LayerNorm), depth and warm-up of post-LN by Liu et al. 2020 (arXiv 2004.08249). Sandwich norms (a norm on
the branch output before the add) follow Ding et al. 2021 (CogView, arXiv 2105.13290) and Gemma 2;
query/key norms Dehghani et al. 2023 (arXiv 2302.05442).

The pass reads the canonical IR (:mod:`normaudit.vocabulary.graph`), so symbolically traced graphs
(``call_module`` nodes, ``get_attr`` parameters) and exported aten graphs (parameters as ``p_*``
placeholders, ``nn_module_stack`` on every node) give the same answer. :func:`analyse` runs three steps:

1. **Residual adds** (:mod:`.residual`): ``skip + branch`` with the branch computed from the skip through a
   weighted op that is not part of a norm (or a projection shortcut on the skip side); marked in
   ``node.meta["normaudit"]["residual"]``. Each gets its **block** (:mod:`.blocks`).
2. **Site placement** (``Site.placement``), in this order: ``none`` for every norm of a model without
   residual adds; ``qk`` (:mod:`.scores`); ``sandwich`` / ``pre`` inside a residual branch, then
   ``post`` / ``embedding`` / ``final`` / ``none`` on the stream (:mod:`.roles`).
3. **Model facts** (:mod:`.model`): ``placement``, ``parallel_residual``, ``has_final_norm``,
   ``num_residual_adds`` and ``blocks``.

Per-site facts in ``Site.stream`` (:class:`normaudit.report.StreamFacts`): ``branch_position``, ``skip_from_norm``,
``no_identity_lost``, ``feeds_norm`` / ``reads_norm`` (:mod:`.roles`); ``contracted_by_scores``
(:mod:`.scores`); ``majority_placement`` and ``majority_blocks`` (:mod:`.majority`); ``unnormed_stream_end``,
``stack_blocks`` and ``stream_end_conv`` (:mod:`.stream_end`); ``reapplied_of`` (:mod:`.reuse`).

Modules: :mod:`.graph` (the graph index the pass reads), :mod:`.records` (its records),
:mod:`.residual`, :mod:`.blocks`, :mod:`.scores`, :mod:`.roles`, :mod:`.reuse`, :mod:`.majority`,
:mod:`.stream_end` (also
the model-level ``model.stream_end``), :mod:`.model`, :mod:`.analysis` (:func:`analyse`, the order of the
steps), and :mod:`.carry` (the model-level facts carried to elided blocks under depth-independent capture).

Example::

    >>> import torch
    >>> from torch import nn
    >>> from normaudit.capture import capture_model
    >>> from normaudit.facts.sites import discover_sites
    >>> from normaudit.report import ModelFacts
    >>> layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True, norm_first=True)
    >>> cap = capture_model(layer, (torch.randn(2, 5, 16),), on_meta=False)
    >>> records, facts = discover_sites(cap), ModelFacts(class_name="TransformerEncoderLayer")
    >>> analyse(cap, records, facts)
    >>> [(r.site.module, r.site.placement) for r in records], facts.placement
    ([('norm1', 'pre'), ('norm2', 'pre')], 'pre')
"""
from normaudit.facts.placement.analysis import analyse, run
from normaudit.facts.placement.blocks import stack_size
from normaudit.facts.placement.carry import carry
from normaudit.facts.placement.majority import mark_mixed
from normaudit.facts.placement.stream_end import find_stream_end, run_stream_end

__all__ = ["analyse", "carry", "find_stream_end", "mark_mixed", "run", "run_stream_end", "stack_size"]
