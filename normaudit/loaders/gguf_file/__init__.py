"""GGUF files (llama.cpp's format) as targets, read with the ``gguf`` package (the optional extra
``normaudit[gguf]``).

:mod:`.reader` opens a file as a hostile file (:func:`open_gguf`, :class:`GgufFile`: the header and only the norm
tensors read, through the interface of :class:`normaudit.loaders.checkpoint.Checkpoint`); :mod:`.sites` finds
the norms by llama.cpp's tensor names and reads the hyperparameters of the metadata; :func:`gguf_target` is the
target the audit gets (``normaudit.audit.checkpoint_only_report`` opens the file itself).
"""
from __future__ import annotations

from pathlib import Path

from normaudit.loaders.gguf_file.reader import GgufFile, INSTALL_HINT, open_gguf, require_gguf
from normaudit.loaders.gguf_file.sites import GgufNorm, Hparams, block_of, find_norms, gguf_sites, hparams

GGUF_SUFFIX = ".gguf"

__all__ = ["GGUF_SUFFIX", "GgufFile", "GgufNorm", "Hparams", "INSTALL_HINT", "block_of", "find_norms", "gguf_sites",
           "gguf_target", "hparams", "open_gguf", "require_gguf"]


def gguf_target(path: str | Path):
    """A GGUF file given as the audit's TARGET: a :class:`normaudit.loaders.ModelUnderAudit` of kind ``gguf``
    with no model (an empty ``nn.Module``). The ``gguf`` package is checked here (UsageError with the install
    hint when it is missing); the file is opened by the audit."""
    from torch import nn

    from normaudit.loaders.model import ModelUnderAudit

    path = Path(path)
    require_gguf(str(path))
    return ModelUnderAudit(model=nn.Module(), inputs=(), on_meta=False, kind="gguf", file=str(path),
                           weights=[path.name])
