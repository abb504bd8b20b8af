"""Reading files that may be hostile: checkpoints, configs and rule files from the internet.

Every reader of normaudit goes through these helpers, which turn whatever a file holds into data or one
:class:`~normaudit.errors.UsageError` (exit 2) saying what the file is, what was expected and what was found:

- only regular files are opened (:func:`require_regular_file`): a FIFO, a device (``/dev/zero`` behind a
  symlink), a socket or a directory is refused from ``os.stat`` before any ``open``, so a reader never
  blocks; :func:`read_regular` also opens with ``O_NONBLOCK`` and checks ``fstat`` again (no race);
- JSON nesting is bounded before parsing (:data:`MAX_NESTING`, :func:`json_nesting`): Python's ``json``
  recurses and raises ``RecursionError`` on ``[[[[...`` (100000 levels), which is not a bad-input error;
- JSON is read as transformers 5 writes it: ``{"__float__": "Infinity"}`` (also ``-Infinity``, ``NaN``) is
  the float (``PreTrainedConfig._encode_special_floats``);
- YAML is read with :class:`ConfigLoader`: safe tags only (``!!python/...`` is refused, nothing is
  constructed from a tag), nesting bounded, and aliases bounded by the size of the document they expand
  to (:data:`MAX_YAML_NODES`): a "billion laughs" file (9 aliases of 9 aliases ... 387 million strings) is
  refused before it is built.
"""
from __future__ import annotations

import errno
import json
import os
import re
import stat
from pathlib import Path
from typing import Any, Optional, Union

import yaml

from normaudit.errors import UsageError

#: deepest nesting of lists/objects accepted in a JSON or YAML file (real configs nest under 10 levels;
#: Python's json recurses once per level and fails near 1000).
MAX_NESTING = 100
#: largest config (JSON/YAML) or checkpoint index read, in bytes (64 MiB: the largest HF config.json files,
#: with big tokenizer-like tables, are a few MB).
MAX_CONFIG_BYTES = 64 * 2 ** 20
#: most YAML nodes a document may expand to once its aliases are followed (an alias bomb expands to
#: hundreds of millions; a training config to a few thousand).
MAX_YAML_NODES = 1_000_000

_FLOAT_TAGS = {"Infinity": float("inf"), "-Infinity": float("-inf"), "NaN": float("nan")}
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKET = re.compile(rb"[^\[\]{}]+")


def file_kind(mode: int) -> str:
    """What an ``st_mode`` says the file is, in words (``a FIFO (named pipe)``, ``a character device``...)."""
    for test, words in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                        (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                        (stat.S_ISSOCK, "a socket"), (stat.S_ISREG, "a regular file")):
        if test(mode):
            return words
    return "not a regular file"


def require_regular_file(path: Union[str, Path], what: str) -> os.stat_result:
    """``os.stat(path)`` when ``path`` (symlinks followed) is a regular file; never opens it.

    ``what`` names the file's role in messages (``checkpoint``, ``config``, ``rule file``). Raises
    UsageError for a missing file, a broken symlink, a symlink loop, or anything but a regular file
    (directory, FIFO, device, socket), saying what was found.
    """
    p = str(path)
    try:
        st = os.stat(p)
    except OSError as err:
        if os.path.islink(p):
            target = _readlink(p)
            cause = ("a symbolic link loop" if err.errno == errno.ELOOP
                     else f"a broken symbolic link (to {target!r})")
            raise UsageError(f"cannot read {what}: expected a regular file, found {cause}", file=p) from None
        cause = "no such file or directory" if err.errno == errno.ENOENT else (err.strerror or str(err))
        raise UsageError(f"cannot read {what}: {cause}", file=p) from None
    if not stat.S_ISREG(st.st_mode):
        link = f" (a symbolic link to {_readlink(p)!r})" if os.path.islink(p) else ""
        raise UsageError(f"cannot read {what}: expected a regular file, found {file_kind(st.st_mode)}{link}",
                         file=p)
    return st


#: leading bytes of formats a file given as a checkpoint may turn out to be, and what each is called
_MAGICS = ((b"PK\x03\x04", "a zip archive"), (b"PK\x05\x06", "an empty zip archive"), (b"\x1f\x8b", "a gzip file"),
           (b"\x7fELF", "an ELF executable"), (b"GGUF", "a GGUF file"), (b"\x89HDF", "an HDF5 file"),
           (b"\x93NUMPY", "a NumPy .npy file"), (b"\x89PNG", "a PNG image"), (b"%PDF", "a PDF document"),
           (b"\x28\xb5\x2f\xfd", "a zstd file"), (b"BZh", "a bzip2 file"), (b"\xfd7zXZ", "an xz file"))


def describe_content(head: bytes) -> str:
    """What a file's first bytes ``head`` say it is, by type only (``a text file``, ``a zip archive``,
    ``binary data of an unknown format``): messages never quote a file's bytes, which may be a secret the
    file was linked to (a ``GITHUB_TOKEN=...`` file behind ``weights.bin``)."""
    if not head:
        return "an empty file (0 bytes)"
    for magic, words in _MAGICS:
        if head.startswith(magic):
            return words
    if looks_like_text(head):
        return "a text file"
    return "binary data of an unknown format (no magic number normaudit knows)"


def looks_like_text(head: bytes) -> bool:
    """True when ``head`` is printable UTF-8 text (tabs and newlines allowed), a character cut at its end
    (up to 3 bytes) aside."""
    for cut in range(min(4, len(head))):
        try:
            text = head[:len(head) - cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
        return bool(text) and all(ch.isprintable() or ch in "\n\r\t" for ch in text)
    return False


def link_roots(folder: Union[str, Path]) -> list[str]:
    """The real folders a file named in ``folder`` may lead to: ``folder`` itself (its own links resolved),
    and for a snapshot of the Hugging Face hub's cache (``<repo>/snapshots/<revision>``, whose files are
    links to ``<repo>/blobs/<hash>``, huggingface_hub's documented cache layout) the repo's ``blobs``."""
    real = os.path.realpath(folder)
    roots = [real]
    parent = os.path.dirname(real)
    if os.path.basename(parent) == "snapshots" and os.path.isdir(os.path.join(os.path.dirname(parent), "blobs")):
        roots.append(os.path.join(os.path.dirname(parent), "blobs"))
    return roots


def require_within(path: Union[str, Path], folder: Union[str, Path], what: str) -> None:
    """Refuse ``path`` (a file named in ``folder``) when its real path, symbolic links resolved, leaves
    ``folder`` (see :func:`link_roots`): a link committed beside a checkpoint must not make normaudit read,
    and describe, a file elsewhere (``w.bin -> ~/.ssh/id_rsa``). The UsageError names both paths."""
    real = os.path.realpath(path)
    if any(real == root or real.startswith(root.rstrip(os.sep) + os.sep) for root in link_roots(folder)):
        return
    raise UsageError(f"cannot read {what}: it is a symbolic link to {real!r}, outside the folder it was given in "
                     f"({os.path.realpath(folder)!r}); normaudit reads nothing outside the folder given (name "
                     "the real file to audit it)", file=str(path))


def _readlink(p: str) -> str:
    try:
        return os.readlink(p)
    except OSError:
        return "?"


def read_regular(path: Union[str, Path], what: str, max_bytes: int = MAX_CONFIG_BYTES) -> bytes:
    """The bytes of a regular file of at most ``max_bytes`` (see :func:`require_regular_file`).

    Opened with ``O_NONBLOCK`` and checked again with ``fstat`` after opening, so a file swapped for a FIFO
    between the two calls still cannot block. Raises UsageError naming the file for a non-regular file,
    a file over ``max_bytes``, or an OS error.
    """
    require_regular_file(path, what)
    p = str(path)
    try:
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as err:
        raise UsageError(f"cannot open {what}: {err.strerror or err}", file=p) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"cannot read {what}: expected a regular file, found {file_kind(st.st_mode)}", file=p)
        if st.st_size > max_bytes:
            raise UsageError(f"{what} too large: {st.st_size} bytes, at most {max_bytes} expected", file=p)
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read(max_bytes + 1)
    except OSError as err:
        raise UsageError(f"cannot read {what}: {err.strerror or err}", file=p) from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise UsageError(f"{what} too large: over {max_bytes} bytes", file=p)
    return data


def json_nesting(data: Union[bytes, str]) -> int:
    """The deepest nesting of ``[``/``{`` in JSON text (brackets inside strings ignored); O(len(data)).

    For invalid JSON (an unclosed string) the count is an upper bound of what a parser would meet.
    """
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    if raw.count(b"[") + raw.count(b"{") <= 1:
        return raw.count(b"[") + raw.count(b"{")
    brackets = _NOT_BRACKET.sub(b"", _STRING.sub(b"", raw))
    depth = deepest = 0
    for byte in brackets:
        if byte in (0x5B, 0x7B):  # [ {
            depth += 1
            if depth > deepest:
                deepest = depth
        else:
            depth -= 1
    return deepest


def decode_special_floats(obj: dict) -> Any:
    """``json`` object hook: ``{"__float__": "Infinity"}`` -> ``inf`` (transformers 5's encoding of the
    floats JSON cannot hold, ``PreTrainedConfig._decode_special_floats``); other objects unchanged."""
    if len(obj) == 1 and isinstance(obj.get("__float__"), str) and obj["__float__"] in _FLOAT_TAGS:
        return _FLOAT_TAGS[obj["__float__"]]
    return obj


def loads_json(data: Union[bytes, str], what: str, file: Optional[str] = None,
               max_nesting: int = MAX_NESTING) -> Any:
    """Parse JSON from an untrusted file: nesting bounded, UTF-8 required, special floats decoded.

    ``what`` names the document in messages (``config``, ``safetensors header``). Raises UsageError
    (with ``file`` and the line where known) for bytes that are not UTF-8, nesting deeper than
    ``max_nesting``, or invalid JSON; never RecursionError.
    """
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as err:
            line = data[: err.start].count(b"\n") + 1
            raise UsageError(f"{what} is not UTF-8 text: byte 0x{data[err.start]:02x} at offset {err.start} "
                             "(expected JSON in UTF-8)", file=file, line=line) from None
    else:
        text = data
    if not text.strip():
        raise UsageError(f"{what} is empty ({len(data)} bytes): expected a JSON document", file=file)
    depth = json_nesting(text)
    if depth > max_nesting:
        raise UsageError(f"{what} nests lists/objects {depth} levels deep; at most {max_nesting} expected",
                         file=file)
    try:
        return json.loads(text, object_hook=decode_special_floats)
    except json.JSONDecodeError as err:
        raise UsageError(f"invalid JSON in {what}: {err.msg} (line {err.lineno} column {err.colno})",
                         file=file, line=err.lineno) from None
    except (ValueError, RecursionError) as err:  # int too long to convert, or a lowered recursion limit
        raise UsageError(f"invalid JSON in {what}: {type(err).__name__}: {str(err)[:200]}", file=file) from None


class ConfigLoader(yaml.SafeLoader):
    """PyYAML's SafeLoader with nesting bounded (:data:`MAX_NESTING`) while composing, so that deep flow
    collections are a YAML error instead of a RecursionError. Use through :func:`loads_yaml`, which also
    bounds alias expansion."""

    def __init__(self, stream):
        super().__init__(stream)
        self._nesting = 0

    def compose_node(self, parent, index):  # noqa: D102 - PyYAML hook
        self._nesting += 1
        try:
            if self._nesting > MAX_NESTING:
                mark = self.peek_event().start_mark
                raise yaml.composer.ComposerError(None, None, f"nesting deeper than {MAX_NESTING} levels", mark)
            return super().compose_node(parent, index)
        finally:
            self._nesting -= 1


def _expanded_size(root: yaml.Node, limit: int) -> tuple[int, Optional[str]]:
    """Nodes the document holds once every alias is followed, and why it is refused (None when it is not):
    more than ``limit`` nodes, nesting past :data:`MAX_NESTING` through aliases, or an alias cycle.
    Memoised per node, so a bomb is measured in time linear in its (small) text."""
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    active: set[int] = set()

    def visit(node: yaml.Node) -> None:
        key = id(node)
        if key in size:
            return
        if key in active:
            raise ValueError("an alias refers to a node that contains it (a cycle)")
        if isinstance(node, yaml.ScalarNode):
            size[key], depth[key] = 1, 0
            return
        children = ([c for pair in node.value for c in pair] if isinstance(node, yaml.MappingNode)
                    else list(node.value))
        active.add(key)
        for child in children:
            visit(child)
        active.discard(key)
        size[key] = 1 + sum(size[id(c)] for c in children)
        depth[key] = 1 + max((depth[id(c)] for c in children), default=0)
        if size[key] > limit:
            raise ValueError(f"its aliases expand it to over {limit} nodes")
        if depth[key] > MAX_NESTING:
            raise ValueError(f"its aliases nest it deeper than {MAX_NESTING} levels")

    try:
        visit(root)
    except ValueError as err:
        return 0, str(err)
    except RecursionError:
        return 0, "nesting too deep to follow"
    return size[id(root)], None


def loads_yaml(text: str, what: str, file: Optional[str] = None, max_nodes: int = MAX_YAML_NODES) -> Any:
    """Parse one YAML document from an untrusted file as plain data (see the module doc).

    Raises UsageError with ``file`` and line for a syntax error, a tag that would build a Python object
    (``!!python/object/apply:os.system``), nesting past :data:`MAX_NESTING`, or aliases that expand the
    document past ``max_nodes`` nodes (or form a cycle). Returns None for an empty document.
    """
    loader = None
    try:
        loader = ConfigLoader(text)  # its reader rejects control characters at once (a YAMLError)
        node = loader.get_single_node()
        if node is None:
            return None
        _, refused = _expanded_size(node, max_nodes)
        if refused:
            raise UsageError(f"{what} refused: {refused} (expected plain data; YAML aliases may repeat at "
                             f"most {max_nodes} nodes in all)", file=file)
        return loader.construct_document(node)
    except yaml.constructor.ConstructorError as err:
        mark = err.problem_mark or err.context_mark
        tag = re.search(r"tag '([^']*)'", str(err.problem or ""))
        found = f"the tag {tag.group(1)!r}" if tag else _yaml_problem(err)
        raise UsageError(f"{what} refused: expected plain YAML data (mappings, lists, strings, numbers), found "
                         f"{found}; normaudit builds no objects from YAML tags", file=file,
                         line=mark.line + 1 if mark else None) from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        raise UsageError(f"invalid YAML in {what}: {_yaml_problem(err)}", file=file,
                         line=mark.line + 1 if mark is not None else None) from None
    except RecursionError:
        raise UsageError(f"{what} nests too deep to read (at most {MAX_NESTING} levels expected)",
                         file=file) from None
    finally:
        if loader is not None:
            loader.dispose()


def _yaml_problem(err: yaml.YAMLError) -> str:
    problem = getattr(err, "problem", None)
    text = problem or (str(err).splitlines() or [type(err).__name__])[0]
    return " ".join(str(text).split())[:200]
