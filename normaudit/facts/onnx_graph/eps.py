"""Eps facts of ONNX sites (``Site.eps_facts``), as :mod:`normaudit.facts.eps` gives them for a PyTorch graph:
the eps each site adds (an operator's ``epsilon``, the constant of a decomposed norm's ``+ eps``), a decomposed
norm that adds none, the dtype it is added in (an operator's ``stash_type``, the input's dtype for operators
without one, the dtype of the ``+ eps`` node of a decomposed norm) and eps as that dtype stores it (0 for 1e-12
in float16), what each configuration declares for the site's kind (``--config``, a ``config.json`` beside the
file: :func:`normaudit.facts.eps.declared_eps`), and the eps of the other sites of its role (the same module
path with the block numbers starred: :func:`normaudit.facts.eps.assign_peers`)."""
from __future__ import annotations

from normaudit.facts.eps import ConfigSource, assign_peers, declared_eps, rounded
from normaudit.facts.onnx_graph.record import OnnxSiteRecord
from normaudit.report import EpsFacts
from normaudit.vocabulary.dtypes import DTYPES


def eps_facts(records: list[OnnxSiteRecord], sources: list[ConfigSource]) -> None:
    """Fill ``site.eps_facts`` of every record, then the peers of every site."""
    for rec in records:
        site = rec.site
        facts = EpsFacts(effective=site.eps, missing=rec.eps_missing, statistic=rec.statistic)
        if facts.statistic != "l2_norm":  # an L2 norm's clamp is no norm-layer eps (normaudit.facts.eps)
            facts.declared, facts.changed = declared_eps(site, facts.effective, sources, None)
        if facts.effective is not None and rec.eps_dtype in DTYPES:
            facts.dtype, facts.dtype_basis = rec.eps_dtype, rec.eps_basis
            facts.in_dtype = rounded(facts.effective, rec.eps_dtype)
        site.eps_facts = facts
    assign_peers([r.site for r in records], {})
