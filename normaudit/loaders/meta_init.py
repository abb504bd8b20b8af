"""Weight initialisation skipped on the meta device while a model is built there.

A tensor on the meta device has a shape and a dtype but no values, so ``torch.nn.init.kaiming_uniform_`` and
the other initialisers have nothing to write; yet on meta each call still runs torch's Python decompositions
of ``uniform_``/``normal_`` (``torch._decomp``), and ``nn.Linear``/``nn.Embedding`` call one or two of them
per layer in their constructors: building a Llama-2-70B-sized ``LlamaModel`` on meta spends most of its time
there, in proportion to the depth. :func:`meta_init_skipped` replaces each initialiser of
:data:`INIT_FUNCTIONS` by one that returns a meta tensor as it is (initialisers return the tensor they were
given, and user code may use that) and initialises any other tensor as before; the originals are put back on
exit, also when the build raises.

This is what ``transformers.initialization.no_init_weights`` does for torch's initialisers, except that it
keeps initialising real tensors and leaves ``PreTrainedModel.init_weights`` alone, which ties the weights
(``tie_word_embeddings``) and, on meta, initialises nothing itself. No value normaudit reads comes from a meta
build: the probes that run real numbers re-initialise their own copy (:mod:`normaudit.probes.common`).
"""
from __future__ import annotations

import contextlib
import functools
import sys
from typing import Any, Callable, Iterator

#: the in-place initialisers of ``torch.nn.init`` (each returns the tensor it was given)
INIT_FUNCTIONS = ("uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_", "dirac_",
                  "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_",
                  "sparse_")
#: modules holding their own reference to some of them (``from torch.nn.init import xavier_uniform_``), as
#: listed by ``transformers.initialization.TORCH_MODULES_TO_PATCH``; only those already imported are patched
MODULES = ("torch.nn.init", "torch.nn.modules.activation", "torch.nn.modules.transformer",
           "torch.nn.modules.linear", "torch.nn.modules.loss", "torch.nn.modules.batchnorm", "torch.nn.modules.conv",
           "torch.nn.modules.normalization", "torch.nn.modules.rnn", "torch.nn.modules.sparse")
#: attribute set on the replacements (so a nested use does not wrap a wrapper)
MARK = "__normaudit_meta_init__"


def skip_on_meta(init: Callable[..., Any]) -> Callable[..., Any]:
    """``init`` (an initialiser ``f(tensor, *args, **kwargs) -> tensor``) made to return a meta ``tensor``
    unchanged, without calling ``init``; any other first argument goes to ``init`` as before."""

    @functools.wraps(init)
    def skipped(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(tensor, "is_meta", False) is True:
            return tensor
        return init(tensor, *args, **kwargs)

    setattr(skipped, MARK, True)
    return skipped


@contextlib.contextmanager
def meta_init_skipped() -> Iterator[None]:
    """While the block runs, the initialisers of :data:`INIT_FUNCTIONS` in the already imported modules of
    :data:`MODULES` (and transformers' table of torch's originals, ``TORCH_INIT_FUNCTIONS``, when transformers
    is loaded) skip meta tensors (:func:`skip_on_meta`); every original is restored on exit. Not thread-safe
    (it patches module attributes), as ``no_init_weights`` is not."""
    saved: list[tuple[Any, str, Any, bool]] = []  # (namespace, name, original, is a dict)
    try:
        for module_name in MODULES:
            module = sys.modules.get(module_name)
            for name in INIT_FUNCTIONS if module is not None else ():
                original = module.__dict__.get(name)
                if callable(original) and not getattr(original, MARK, False):
                    saved.append((module, name, original, False))
                    setattr(module, name, skip_on_meta(original))
        hf_init = sys.modules.get("transformers.initialization")
        table = getattr(hf_init, "TORCH_INIT_FUNCTIONS", None)
        if isinstance(table, dict):
            for name, original in list(table.items()):
                if callable(original) and not getattr(original, MARK, False):
                    saved.append((table, name, original, True))
                    table[name] = skip_on_meta(original)
        yield
    finally:
        for namespace, name, original, is_dict in reversed(saved):
            if is_dict:
                namespace[name] = original
            else:
                setattr(namespace, name, original)
