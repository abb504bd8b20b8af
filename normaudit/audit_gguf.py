"""One GGUF file's audit without model code: its norms, their statistics and its metadata, compared with the Hugging
Face config it was converted from when there is one (``--config``, else a ``config.json`` beside the file).

:func:`inspect_gguf` gives :func:`normaudit.audit.checkpoint_only_report` what a checkpoint alone gives it (sites
with gain and bias statistics, the config, the parameter count, notes), plus the conversion facts of
:mod:`normaudit.facts.conversion`. The config's model is built on the meta device (:mod:`normaudit.loaders.hf`)
only to name its norms, their eps and shapes and, by running each norm class once on a few numbers
(:func:`normaudit.probes.gain_form.gain_form`), how it applies its gain.
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, Optional

from normaudit.errors import UsageError
from normaudit.facts.conversion import ReferenceNorm, compare, reference_norms
from normaudit.loaders.gguf_file import GgufFile, Hparams, gguf_sites, hparams, open_gguf
from normaudit.options import AuditOptions
from normaudit.report import GgufModelFacts, ModelFacts

_LAYER_KEYS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers")


@dataclasses.dataclass
class WeightsOnly:
    """What a target of weights alone (a checkpoint, a GGUF file) gives the report: its sites, the config its
    rules read (``config``, ``config_source``, ``config_origin``), the model facts and the notes, in order."""

    sites: list
    config: dict
    config_source: Optional[str]
    config_origin: Optional[str]
    model: ModelFacts
    notes: list[str]


def _size(n: float) -> str:
    """A byte count in words (``1.2 MB``)."""
    for unit in ("bytes", "kB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def _config(opts: AuditOptions, gfile: GgufFile) -> tuple[Optional[dict], Optional[str], Optional[str], Optional[Path]]:
    """(config, its name, origin, its file) of the audit: ``--config`` (origin ``cli``), else the file's
    sibling ``config.json`` (origin ``checkpoint``), else all None."""
    from normaudit.loaders.config import load_config

    if opts.config_data is not None:
        return dict(opts.config_data), "the given config", "cli", None
    if opts.config:
        return load_config(opts.config), Path(opts.config).name, "cli", Path(opts.config)
    if gfile.config is not None:
        return dict(gfile.config), Path(gfile.config_source).name + " (beside the file)", "checkpoint", \
            Path(gfile.config_source)
    return None, None, None, None


def _references(config: dict, file: Optional[Path], hp: Hparams, gguf: Any,
                notes: list[str]) -> tuple[Optional[list[ReferenceNorm]], Optional[str], dict[str, str]]:
    """(the config's norms under llama.cpp's names, the class built, class name -> gain form), or (None, None,
    {}) with a note saying why when the config's model cannot be built or mapped (a YAML training config, an
    unknown model_type, an architecture the installed gguf package does not know)."""
    from normaudit.loaders.hf import MAX_LAYERS, load_hf_target
    from normaudit.probes.gain_form import gain_form

    arch = {name: a for a, name in gguf.MODEL_ARCH_NAMES.items()}.get(hp.architecture or "")
    if arch is None:
        notes.append(f"the installed gguf package has no tensor-name map for architecture {hp.architecture!r}: the "
                     "file's norms were compared with the config's keys only")
        return None, None, {}
    if file is None or file.suffix.lower() != ".json":
        notes.append("the config is no Hugging Face config.json: the file's norms were compared with its keys only")
        return None, None, {}
    try:
        built = load_hf_target(file)
    except UsageError as err:
        notes.append(f"the config's model could not be built ({err.message}): "
                     "the file's norms were compared with the config's keys only")
        return None, None, {}
    layers = max([hp.block_count or 0] + [config.get(k) for k in _LAYER_KEYS if isinstance(config.get(k), int)])
    name_map = gguf.get_tensor_name_map(arch, min(int(layers), MAX_LAYERS))
    refs = reference_norms(built.model, name_map)
    forms: dict[str, str] = {}
    for ref in refs:
        if ref.class_name not in forms:
            forms[ref.class_name] = gain_form(ref.obj)
    factory = built.factory or type(built.model).__name__
    return refs, factory.split(".")[0], forms


def inspect_gguf(opts: AuditOptions, path: str) -> WeightsOnly:
    """The weights-only inspection of GGUF file ``path`` (see the module docstring). Raises UsageError for a
    file :func:`normaudit.loaders.gguf_file.open_gguf` refuses, or a ``--config`` that cannot be read."""
    with open_gguf(path) as gfile:
        hp = hparams(gfile)
        sites, unmapped, known = gguf_sites(gfile, hp)
        num_parameters = sum(math.prod(gfile.shape(k)) for k in gfile.keys())
        tensors, read, size, gguf = len(gfile), gfile.bytes_read, gfile.size, gfile._gguf
        config, source, origin, file = _config(opts, gfile)
    arch = hp.architecture
    facts = GgufModelFacts(architecture=arch, known_architecture=known, block_count=hp.block_count,
                           config_source=source, unmapped=unmapped)
    notes = [f"GGUF file ({arch or 'no general.architecture'}, {tensors} tensors, {path}): no model code, so the norms "
             "are the tensors the gguf package's name map calls norms, their eps the file's metadata; axes and "
             f"placement are unknown and only the checkpoint rules ran (read {_size(read)} of {_size(size)}: the "
             "header and the norm tensors)"]
    if not known:
        notes.append(f"the installed gguf package does not know architecture {arch!r}: the norm names of every "
                     "architecture were looked for")
    if unmapped:
        notes.append(f"norm-named tensors that llama.cpp's {arch} architecture does not define (not audited, llama.cpp "
                     "does not load them): " + ", ".join(unmapped[:8]) + (" ..." if len(unmapped) > 8 else ""))
    refs, forms = None, {}
    if config is not None:
        refs, facts.reference, forms = _references(config, file, hp, gguf, notes)
        notes.append(f"compared with {source}" + (f" ({facts.reference} built on the meta device)" if facts.reference
                                                  else ""))
    compare(sites, facts, hp, config, source, refs, forms)
    model = ModelFacts(class_name=f"GGUF {arch}" if arch else "GGUF", num_parameters=num_parameters,
                       config_source=source, gguf=facts)
    return WeightsOnly(sites=sites, config=dict(config or {}), config_source=source, config_origin=origin,
                       model=model, notes=notes)
