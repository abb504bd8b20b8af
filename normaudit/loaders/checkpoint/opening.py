"""Opening a checkpoint by path as a :class:`Checkpoint`, and a checkpoint as the audit's target.

A path is a weights file, a sharded ``*.index.json`` or a directory holding one (:func:`open_checkpoint`).
A :class:`Checkpoint` lists its keys with wrapper prefixes removed, gives shapes and dtypes without reading
data and reads tensors one by one, finds the config beside or inside it, and maps a model's ``state_dict``
keys onto its own (:meth:`Checkpoint.match_keys`, :meth:`Checkpoint.align_keys`).
"""
from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Optional

import torch

from normaudit.errors import UsageError
from normaudit.loaders.checkpoint.common import TORCH_SUFFIXES, read_json
from normaudit.loaders.checkpoint.formats import ShardedReader, open_file
from normaudit.loaders.safe_read import require_regular_file, require_within

# Directory layouts, in order of preference (Hugging Face names first).
_DIR_WEIGHTS = ("model.safetensors.index.json", "model.safetensors",
                "pytorch_model.bin.index.json", "pytorch_model.bin")


_ORIG_MOD = re.compile(r"(^|\.)_orig_mod\.")


def _canonical(key: str) -> str:
    key = _ORIG_MOD.sub(r"\1", key)
    while key.startswith(("module.", "model.")):
        key = key.split(".", 1)[1]
    return key


class Checkpoint:
    """An opened checkpoint: key listing, shapes and dtypes without reading data; tensors read one by one.

    Keys (``keys()``) are the checkpoint's keys with wrapper prefixes removed: ``_orig_mod.`` components
    (``torch.compile``) anywhere, a leading ``module.`` (DDP/DeepSpeed), and with ``strip_model_prefix`` a
    leading ``model.``; a key is left raw when stripping would make it collide with another. ``raw_keys()``
    gives the keys as stored; every method taking a key accepts either form.

    Attributes: ``path`` (what was opened), ``weights_path`` (the weights file or index actually read),
    ``format`` (``safetensors``, ``torch``, ``sharded``), ``config`` (a dict, or None) and ``config_source``
    (``DIR/config.json``, ``FILE:__metadata__[.KEY]`` or ``FILE:ENTRY[/ENTRY]``): a sibling ``config.json``
    wins over a config embedded in the weights file. Use as a context manager or call ``close()``.
    """

    def __init__(self, path: Path, weights_path: Path, reader, strip_model_prefix: bool = False):
        self.path = path
        self.weights_path = weights_path
        self._r = reader
        self.format: str = reader.format
        raw = reader.keys()
        strips = ["module."] + (["model."] if strip_model_prefix else [])
        norm = [_ORIG_MOD.sub(r"\1", k) for k in raw]
        for p in strips:
            norm = [k[len(p):] if k.startswith(p) else k for k in norm]
        if len(set(norm)) != len(norm):  # collisions: keep the colliding keys raw
            seen: dict[str, int] = {}
            for k in norm:
                seen[k] = seen.get(k, 0) + 1
            norm = [k if seen[k] == 1 else r for k, r in zip(norm, raw)]
            if len(set(norm)) != len(norm):
                norm = list(raw)
        self._to_raw = dict(zip(norm, raw))
        self._from_raw = dict(zip(raw, norm))
        self.config, self.config_source = self._find_config()

    def _find_config(self) -> tuple[Optional[dict], Optional[str]]:
        folder = self.path if self.path.is_dir() else self.path.parent
        sibling = folder / "config.json"
        if os.path.lexists(sibling) and not sibling.is_dir():  # a FIFO or a device named so is refused
            require_within(sibling, folder, "config")
            cfg = read_json(sibling, "config")
            if isinstance(cfg, dict):
                return cfg, str(sibling)
        return self._r.embedded_config()

    # -- listing
    def keys(self) -> list[str]:
        """All tensor keys (normalised, see the class doc), in the checkpoint's order."""
        return list(self._to_raw)

    def raw_keys(self) -> list[str]:
        """All tensor keys exactly as stored."""
        return list(self._from_raw)

    def __len__(self) -> int:
        return len(self._to_raw)

    def __contains__(self, key: object) -> bool:
        return key in self._to_raw or key in self._from_raw

    def raw_key(self, key: str) -> str:
        """The stored key for ``key`` (normalised or raw); KeyError if absent."""
        if key in self._to_raw:
            return self._to_raw[key]
        if key in self._from_raw:
            return key
        raise KeyError(key)

    def shape(self, key: str) -> tuple[int, ...]:
        """The tensor's shape, without reading its data."""
        return self._r.shape(self.raw_key(key))

    def dtype(self, key: str) -> torch.dtype:
        """The tensor's stored dtype, without reading its data."""
        return self._r.dtype(self.raw_key(key))

    def get(self, key: str) -> torch.Tensor:
        """Read one tensor (CPU, stored dtype); only its bytes are read. UsageError if unreadable."""
        return self._r.get(self.raw_key(key))

    def prefetch(self, keys: Iterable[str]) -> None:
        """Hint that these tensors will be read soon (safetensors: ``posix_fadvise(WILLNEED)`` on exactly
        their byte ranges, so the reads run in parallel and mmap read-ahead does not pull in their
        neighbours). No data is counted in ``bytes_read`` until ``get``; a no-op for torch files."""
        self._r.prefetch([self.raw_key(k) for k in keys])

    @property
    def bytes_read(self) -> int:
        """Bytes read from disk so far. Exact for safetensors (8-byte length + JSON header once, plus the
        data bytes of each ``get``); for mmapped torch zips the pickle records plus the bytes of each
        tensor fetched (page granularity ignored); the whole file size for torch files loaded without mmap."""
        return self._r.bytes_read

    def match_keys(self, model_keys: Iterable[str]) -> dict[str, str]:
        """Map a model's ``state_dict`` keys onto this checkpoint's keys (the ``keys()`` form).

        Exact matches (normalised or raw) first; then keys equal after removing ``module.``, ``model.``
        and ``_orig_mod.`` prefixes on both sides, when that match is unique. Unmatched model keys are
        absent from the result.
        """
        model_keys = list(model_keys)
        out: dict[str, str] = {}
        used: set[str] = set()
        for mk in model_keys:
            if mk in self:
                out[mk] = mk if mk in self._to_raw else self._from_raw[mk]
                used.add(out[mk])
        by_canon: dict[str, list[str]] = {}
        for ck in self._to_raw:
            if ck not in used:
                by_canon.setdefault(_canonical(ck), []).append(ck)
        wanted: dict[str, list[str]] = {}
        for mk in model_keys:
            if mk not in out:
                wanted.setdefault(_canonical(mk), []).append(mk)
        for canon, mks in wanted.items():
            cks = by_canon.get(canon, [])
            if len(mks) == 1 and len(cks) == 1:
                out[mks[0]] = cks[0]
        return out

    def align_keys(self, model_keys: Iterable[str], optional: Iterable[str] = ()) -> tuple[dict[str, str], Optional[str]]:
        """``match_keys``, plus one leading prefix when the keys of the two sides differ by it.

        When fewer than half of ``model_keys`` match, a prefix of one to three components that the checkpoint
        adds to every key (``bert.`` of a ``BertForMaskedLM`` checkpoint loaded into a ``BertModel``) or lacks
        (the model's ``backbone.``) is tried, and kept when it matches more keys than ``match_keys`` did.
        ``optional`` keys (names the model does not have, asked about by the caller) are matched the same way
        but do not count towards choosing the prefix. Returns (model key -> checkpoint key, a sentence
        describing the prefix used or None).

        Example (a checkpoint holding ``bert.embeddings.LayerNorm.weight``)::

            ckpt.align_keys(["embeddings.LayerNorm.weight"])
            # ({'embeddings.LayerNorm.weight': 'bert.embeddings.LayerNorm.weight'},
            #  "the checkpoint's keys carry the prefix 'bert.'")
        """
        model_keys, optional = list(model_keys), [k for k in optional if k not in set(model_keys)]
        out = self.match_keys(model_keys + optional)
        hits = sum(k in out for k in model_keys)
        if not model_keys or hits * 2 >= len(model_keys):
            return out, None
        ck = self._to_raw
        by_suffix: dict[str, set[str]] = {}
        for c in ck:
            parts = c.split(".")
            for i in range(1, min(len(parts), 4)):
                by_suffix.setdefault(".".join(parts[i:]), set()).add(".".join(parts[:i]) + ".")
        add: dict[str, int] = {}
        drop: dict[str, int] = {}
        for k in model_keys:
            if k in out:
                continue
            for pre in by_suffix.get(k, ()):
                add[pre] = add.get(pre, 0) + 1
            parts = k.split(".")
            for i in range(1, min(len(parts), 4)):
                if ".".join(parts[i:]) in ck:
                    pre = ".".join(parts[:i]) + "."
                    drop[pre] = drop.get(pre, 0) + 1
        best = max([(n, "add", pre) for pre, n in add.items()] + [(n, "drop", pre) for pre, n in drop.items()],
                   default=None)
        if best is None or best[0] <= hits:
            return out, None
        _, how, pre = best
        used = set(out.values())
        for k in model_keys + optional:
            if k in out:
                continue
            cand = pre + k if how == "add" else (k[len(pre):] if k.startswith(pre) else None)
            if cand is not None and cand in ck and cand not in used:
                out[k] = cand
                used.add(cand)
        what = (f"the checkpoint's keys carry the prefix {pre!r}" if how == "add"
                else f"the model's keys carry the prefix {pre!r}, the checkpoint's do not")
        return out, what

    def close(self) -> None:
        self._r.close()

    def __enter__(self) -> "Checkpoint":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Checkpoint({str(self.weights_path)!r}, format={self.format!r}, tensors={len(self)})"


def _refuse_special_members(d: Path) -> None:
    """Refuse a directory whose weights-like members (``*.safetensors``, ``*.bin``, ``*.index.json``,
    ``config.json``...) include a FIFO, a device or a socket, or a link to one (``x.safetensors ->
    /dev/zero``): such a name is never opened, whichever file the audit would have read."""
    for p in sorted(d.iterdir()):
        if p.name.endswith((".safetensors", ".index.json", *TORCH_SUFFIXES)) or p.name == "config.json":
            if p.exists() and not p.is_file() and not p.is_dir():
                require_regular_file(p, "checkpoint directory member")


def _resolve_dir(d: Path) -> Path:
    # Anything but a directory counts as a candidate (a FIFO named model.safetensors is refused by its
    # reader, saying what it is, rather than skipped).
    for name in _DIR_WEIGHTS:
        if os.path.lexists(d / name) and not (d / name).is_dir():
            return d / name
    files = sorted(p for p in d.iterdir() if not p.is_dir())
    indexes = [p for p in files if p.name.endswith(".index.json")]
    weights = [p for p in files if p.name.endswith((".safetensors", *TORCH_SUFFIXES))]
    cands = indexes or weights
    if len(cands) == 1:
        return cands[0]
    if not cands:
        raise UsageError("no weights found in directory (looked for " + ", ".join(_DIR_WEIGHTS)
                         + ", *.safetensors, *.pt, *.pth, *.bin, *.ckpt)", file=str(d))
    raise UsageError("several weight files, name one: " + ", ".join(p.name for p in cands), file=str(d))


def open_checkpoint(path: str | Path, *, strip_model_prefix: bool = False) -> Checkpoint:
    """Open a checkpoint file or directory without reading tensor data.

    ``path``: a ``.safetensors`` file, a ``*.index.json`` (sharded; shards are resolved next to it), a
    ``.pt/.pth/.bin/.ckpt`` torch file, or a directory holding one of these (Hugging Face names preferred:
    ``model.safetensors.index.json``, ``model.safetensors``, ``pytorch_model.bin.index.json``,
    ``pytorch_model.bin``; else its only index or weights file) and optionally ``config.json``.
    ``strip_model_prefix`` also strips a leading ``model.`` from the keys (see ``Checkpoint``).

    A weights file (or index, or shard, or ``config.json`` beside it) that is a symbolic link whose real path
    leaves its folder is refused (:func:`normaudit.loaders.safe_read.require_within`).

    Raises ``UsageError`` (with the file) for a missing path, an unknown extension, a directory without
    (or with several candidate) weights, a truncated or corrupted safetensors file, an index naming a
    missing shard, a torch file that ``weights_only=True`` refuses to unpickle, or an unreadable one.
    """
    path = Path(path)
    if not path.is_dir():
        require_regular_file(path, "checkpoint")
    weights = _resolve_dir(path) if path.is_dir() else path
    # the weights file a directory holds, or a file given itself, must really be in that folder
    require_within(weights, path if path.is_dir() else path.parent,
                   "checkpoint" if weights == path else "checkpoint weights file")
    name = weights.name
    if name.endswith(".index.json"):
        reader = ShardedReader(weights)
    elif name.endswith(".safetensors") or name.endswith(TORCH_SUFFIXES):
        reader = open_file(weights)
    else:
        raise UsageError(f"unknown checkpoint extension {weights.suffix or '(none)'!r} (expected .safetensors, "
                         ".pt, .pth, .bin, .ckpt, *.index.json or a directory)", file=str(weights))
    if path.is_dir():  # after the reader's own checks, which name a bad shard as the index's
        try:
            _refuse_special_members(path)
        except UsageError:
            reader.close()
            raise
    return Checkpoint(path, weights, reader, strip_model_prefix=strip_model_prefix)


def checkpoint_target(path: str | Path):
    """A checkpoint given as the audit's TARGET: a :class:`normaudit.loaders.ModelUnderAudit` of kind
    ``checkpoint`` with no model (an empty ``nn.Module``); the audit opens the file itself
    (``normaudit.audit.checkpoint_only_report``), so an unreadable or refused file is a UsageError there."""
    from torch import nn

    from normaudit.loaders.model import ModelUnderAudit

    path = Path(path)
    return ModelUnderAudit(model=nn.Module(), inputs=(), on_meta=False, kind="checkpoint", file=str(path),
                           weights=[path.name])
