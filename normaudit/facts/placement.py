"""Placement of each norm on the residual stream (pre-LN, post-LN, sandwich, final, ...).

Pre-LN vs post-LN is a Transformer design choice, not part of the LayerNorm paper: post-LN in
Vaswani et al. 2017, pre-LN analysed by Xiong et al. 2020 (arXiv 2002.04745).
"""
from __future__ import annotations

from normaudit.capture import Capture
from normaudit.report import ModelFacts


def analyse(cap: Capture, records: list, model: ModelFacts) -> None:
    """Set ``site.placement`` for every record and ``model.placement``/``parallel_residual``/``blocks``."""
    return None
