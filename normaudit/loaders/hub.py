"""Hugging Face hub ids as targets: ``org/name`` or ``org/name@revision``, resolved from the local cache only.

An id is looked up with huggingface_hub's own cache functions (``snapshot_download(..., local_files_only=True)``:
``refs/<revision>`` names the commit, ``snapshots/<commit>/`` holds the files), in the cache huggingface_hub
reads from the environment (``HF_HUB_CACHE``, else ``HF_HOME``/hub, else ``~/.cache/huggingface/hub``), with
``HF_HUB_OFFLINE`` set for the process as for every Hugging Face target: nothing is ever downloaded. The
snapshot folder found is audited as that folder would be: a ``config.json`` with the weights beside it read
lazily (:mod:`normaudit.loaders.hf`), weights alone as a checkpoint, a single ``.gguf`` as a GGUF file. An id that is not in the cache is a UsageError (exit 2) naming the cache searched and
the command that fetches it. A path that exists always wins over an id (:func:`normaudit.loaders.load_model`
looks for one first).
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Callable, Optional

from normaudit.errors import UsageError
from normaudit.loaders.safe_read import require_regular_file

#: ``org/name`` (huggingface_hub's repo-id rule: letters, digits, ``-``, ``_``, ``.``; at most 96 characters each
#: side) and an optional ``@revision`` (a branch, tag or commit hash)
_HUB_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95})(?:@(?P<revision>[\w.-][\w./-]{0,254}))?$")
#: names that are files, not repositories: a missing ``models/gpt.py`` or ``out/model.gguf`` stays "no such file"
_FILE_SUFFIXES = (".py", ".json", ".yaml", ".yml", ".toml", ".gguf", ".onnx", ".safetensors", ".pt", ".pth", ".bin",
                  ".ckpt")
HINT = "Hugging Face hub ids need the 'huggingface_hub' package: pip install 'normaudit[hub]'"


def parse_hub_id(target: str) -> Optional[tuple[str, Optional[str]]]:
    """(repo id, revision or None) of a target written as a hub id, else None.

    >>> parse_hub_id("Qwen/Qwen3-0.6B@main")
    ('Qwen/Qwen3-0.6B', 'main')
    >>> parse_hub_id("models/gpt.py") is None
    True
    """
    m = _HUB_ID.match(target)
    if m is None:
        return None
    repo, revision = m.group("repo"), m.group("revision")
    if ".." in repo or "--" in repo or repo.lower().endswith(_FILE_SUFFIXES) or (revision and ".." in revision):
        return None
    return repo, revision


def is_hub_id(target: str) -> bool:
    """True when ``target`` is written as a hub id (:func:`parse_hub_id`)."""
    return parse_hub_id(target) is not None


def _hub() -> Any:
    """huggingface_hub, imported without network access for this process; UsageError with the install hint."""
    from normaudit.loaders.hf import set_offline

    set_offline()
    try:
        import huggingface_hub
    except ImportError:
        raise UsageError(HINT) from None
    return huggingface_hub


def fetch_command(repo: str, revision: Optional[str], hub: Any) -> str:
    """The command that downloads ``repo`` into the cache with the installed huggingface_hub: ``hf download``
    (huggingface_hub 1.0 and later; ``huggingface-cli download`` before)."""
    major = str(getattr(hub, "__version__", "1")).split(".")[0]
    tool = "huggingface-cli" if major.isdigit() and int(major) < 1 else "hf"
    return f"{tool} download {repo}" + (f" --revision {revision}" if revision else "")


def _not_cached(target: str, repo: str, revision: Optional[str], cache: str, hub: Any, why: str) -> UsageError:
    """The error of an id the cache does not hold (``why``: ``not`` or ``only partly``)."""
    return UsageError(f"no such file or directory, and the Hugging Face hub id {repo!r}"
                      + (f" at revision {revision!r}" if revision else "") + f" is {why} in the local cache {cache}: "
                      f"normaudit never downloads; fetch it with `{fetch_command(repo, revision, hub)}`",
                      file=target)


def resolve_hub_id(target: str) -> Path:
    """The snapshot folder of hub id ``target`` in the local cache (see the module docstring).

    Raises UsageError when huggingface_hub is missing, when the id (or its revision) is not in the cache or only
    partly (an interrupted download), or when the cache's ``refs`` file is not a regular file or leads outside
    the repository's ``snapshots`` folder."""
    repo, revision = parse_hub_id(target) or (target, None)
    hub = _hub()
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    cache = str(Path(constants.HF_HUB_CACHE).expanduser())
    storage = Path(cache) / repo_folder_name(repo_id=repo, repo_type="model")
    if not storage.is_dir():
        raise _not_cached(target, repo, revision, cache, hub, "not")
    ref = storage / "refs" / (revision or constants.DEFAULT_REVISION)
    if os.path.lexists(ref):  # huggingface_hub reads it whole: a FIFO or device there is refused first
        require_regular_file(ref, "hub cache ref")
    try:
        folder = Path(hub.snapshot_download(repo, revision=revision, local_files_only=True))
    except Exception as err:  # noqa: BLE001 - LocalEntryNotFoundError, an incomplete snapshot, a bad id
        incomplete = "incomplete" in str(err).lower() or "missing" in str(err).lower()
        raise _not_cached(target, repo, revision, cache, hub, "only partly" if incomplete else "not") from None
    snapshots = (storage / "snapshots").resolve()
    if not folder.resolve().is_relative_to(snapshots) or not folder.is_dir():
        raise UsageError(f"the hub cache's refs for {repo!r} lead outside its snapshots folder {snapshots}",
                         file=str(ref))
    return folder


def _entry(folder: Path) -> Path:
    """What of a snapshot folder is audited: the folder itself (a ``config.json``, or weights alone), or its
    one ``.gguf`` file. UsageError when it holds several GGUF files and nothing else to audit."""
    if (folder / "config.json").exists():
        return folder
    ggufs = sorted(p for p in folder.iterdir() if p.suffix.lower() == ".gguf" and not p.is_dir())
    if len(ggufs) == 1:
        return ggufs[0]
    if len(ggufs) > 1:
        raise UsageError("the hub snapshot holds several GGUF files: give one of them as the target: "
                         + ", ".join(str(p) for p in ggufs[:8]) + (" ..." if len(ggufs) > 8 else ""), file=str(folder))
    return folder


def load_hub_target(target: str, load: Callable[[str], Any]) -> Any:
    """Audit hub id ``target`` from the cache: ``load`` (:func:`normaudit.loaders.load_model`) of its snapshot
    folder (or the folder's one GGUF file), with ``hub`` and ``resolved`` set on the result and a note saying
    which folder was read."""
    folder = resolve_hub_id(target)
    entry = _entry(folder)
    mua = load(str(entry))
    mua.hub = target
    mua.resolved = str(entry)
    mua.notes.append(f"hub id {target} read from the local Hugging Face cache: {entry}")
    return mua
