"""``--add-noqa``: write ``# normaudit: ignore[ID]`` comments on the lines of the current findings, like
``ruff --add-noqa``, so a repository can adopt normaudit at once and fix its findings one by one.

Where a comment goes is where :mod:`normaudit.suppress` looks for it, so a re-run reports none of the
findings placed:

- the finding's ``source`` line, else a line of a site of the same module (its ``source``, ``definition``,
  ``call``, ``computation``), the first of them that lies in the user's own files
  (:func:`normaudit.loaders.pyfile.is_user_file`: never site-packages, the standard library, torch or
  normaudit); a line inside a torch.nn container statement written out over several lines is the child's
  own line (:meth:`normaudit.suppress.SuppressionIndex.construction`);
- at the end of that line, after any code and comment; when the line cannot take a comment (it ends in a
  backslash continuation or inside a multi-line string), after the closing parenthesis of the call that
  starts on it;
- an existing ``# normaudit: ignore[A]`` comment there is extended (``ignore[A, B]``), not repeated; another
  comment is kept and the directive follows it (``# note  # normaudit: ignore[NE101]``).

A finding about the model as a whole (no line of its own, not a checkpoint finding: NP101, NP107, ...) goes
on the model's ``class <Model>`` line in the target file, else its factory's ``def`` line, where SARIF and
concise output show it (:func:`normaudit.suppress.model_line`).

Nothing else in a file changes: its encoding (and BOM), line endings and every other byte are kept. Findings
with no line in the user's files (checkpoint findings, model-level findings of a model whose class and
factory lines are not in the user's files, findings inside an installed library) and ``NK901`` (an unused
suppression, fixed by removing codes) are counted and left.
Every file is checked writable before any is written.
"""
from __future__ import annotations

import io
import os
import re
import tokenize
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional, Sequence

from normaudit.errors import UsageError
from normaudit.report import Finding, Report, SourceLocation
from normaudit.suppress import UNUSED_RULE, SuppressionIndex, _statements, model_level, model_line, parse_comment

_DIRECTIVE = re.compile(r"(normaudit\s*:\s*ignore)\s*\[([^\]]*)\]", re.IGNORECASE)
_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$")


@dataclass
class NoqaResult:
    """What :func:`add_noqa` did: ``added`` comments written or extended, in ``files`` (paths as given by
    the report), ``findings`` placed, ``left`` findings with no line in the user's files (or ``NK901``),
    ``unplaced`` ``(file, line, cause)`` of lines that could take no comment (their findings are in ``left``)."""

    added: int = 0
    files: list[str] = field(default_factory=list)
    findings: int = 0
    left: list[Finding] = field(default_factory=list)
    unplaced: list[tuple[str, int, str]] = field(default_factory=list)

    def summary(self) -> str:
        """One line for stderr."""
        text = (f"normaudit: added {self.added} suppression comment(s) for {self.findings} finding(s) "
                f"in {len(self.files)} file(s)")
        if self.unplaced:
            text += f"; {len(self.unplaced)} line(s) could take no comment"
        if self.left:
            text += (f"; {len(self.left)} finding(s) left as they are (no line in your files, or an unused "
                     "suppression to remove)")
        return text


def check_targets(targets: Iterable[str]) -> None:
    """Raise UsageError for a target that is not a file or directory on disk (``package.module:factory``,
    an in-memory model): ``--add-noqa`` only writes into files the user named or that sit beside them."""
    from normaudit.loaders.pyfile import split_target

    for spec in targets:
        path = split_target(spec)[0]
        if not path.exists():
            raise UsageError(f"--add-noqa needs targets that are files or directories on disk, not {spec!r} "
                             "(name the model file: path/to/model.py[:factory])")


def split_lines(text: str) -> list[str]:
    """``text`` split into lines that keep their own ending (``\\n``, ``\\r\\n`` or ``\\r``, the line breaks
    of Python's tokenizer; unlike ``str.splitlines`` a form feed is no break)."""
    return _LINE.findall(text)


def _slots(lines: Sequence[str]) -> dict[int, Optional[tokenize.TokenInfo]]:
    """``line -> its comment token (None if none)`` for the lines that can end in a comment: a NEWLINE or NL
    token ends them (not a backslash continuation, not the inside of a multi-line string). Raises
    tokenize.TokenError / SyntaxError when the text does not tokenize."""
    slots: dict[int, Optional[tokenize.TokenInfo]] = {}
    it = iter(lines)
    for tok in tokenize.generate_tokens(lambda: next(it, "")):
        if tok.type == tokenize.COMMENT:
            slots[tok.start[0]] = tok
        elif tok.type in (tokenize.NEWLINE, tokenize.NL):
            slots.setdefault(tok.start[0], None)
    return slots


def _with_codes(line: str, comment: Optional[tokenize.TokenInfo], codes: set[str]) -> Optional[str]:
    """``line`` (with its ending) carrying ``# normaudit: ignore[...]`` for ``codes``; None when a comment
    there already covers them all (a bare ``ignore``, or every code listed)."""
    body = line.rstrip("\r\n")
    end = line[len(body):]
    if comment is not None:
        parsed = parse_comment(comment.string)
        if parsed is not None:
            have = parsed[1]
            if have is None or codes <= {c.upper() for c in have}:
                return None
            m = _DIRECTIVE.search(body, comment.start[1])
            if m is not None:
                extra = sorted(codes - {c.upper() for c in have})
                merged = ", ".join([*have, *extra])
                return body[:m.start(2)] + merged + body[m.end(2):] + end
    return body.rstrip() + f"  # normaudit: ignore[{', '.join(sorted(codes))}]" + end


def edit_source(text: str, wanted: dict[int, set[str]]) -> tuple[str, int, list[tuple[int, str]]]:
    """Add the suppression comments ``wanted`` (``line -> rule ids``) to the Python source ``text``.

    Returns the new text, the number of lines written or extended, and ``(line, cause)`` for each line that
    could take no comment. Lines are 1-based as in tracebacks. Raises tokenize.TokenError / SyntaxError when
    ``text`` is not Python that tokenizes."""
    lines = split_lines(text)
    plain = [ln.rstrip("\r\n") + "\n" if ln.endswith(("\r", "\n")) else ln for ln in lines]  # as tokenize.open reads
    slots = _slots(plain)
    starts, _containers = _statements("".join(plain))
    closing = {}
    for end, firsts in starts.items():
        for first in firsts:
            closing.setdefault(first, set()).add(end)
    per_line: dict[int, set[str]] = {}
    unplaced: list[tuple[int, str]] = []
    for line, codes in sorted(wanted.items()):
        if not 1 <= line <= len(lines):
            unplaced.append((line, f"no line {line}: the file has {len(lines)} (changed since the audit?)"))
            continue
        where = line if line in slots else min((e for e in closing.get(line, ()) if e in slots), default=None)
        if where is None:
            unplaced.append((line, "the line cannot take a comment (a continuation or inside a string)"))
            continue
        per_line.setdefault(where, set()).update(codes)
    written = 0
    for where, codes in per_line.items():
        new = _with_codes(lines[where - 1], slots[where], codes)
        if new is not None:
            lines[where - 1] = new
            written += 1
    return "".join(lines), written, unplaced


def _finding_line(finding: Finding, report: Report, target: Optional[Path],
                  index: SuppressionIndex) -> Optional[SourceLocation]:
    """The first line a suppression of ``finding`` may sit on (:func:`normaudit.suppress._locations`) that
    is in the user's own Python files (for a model-level finding at last the model's class or factory line);
    None when there is none."""
    from normaudit.loaders.pyfile import is_user_file

    locs = [finding.source] if finding.source is not None else []
    for site in report.sites:
        if site.module == finding.module:
            locs += [loc for loc in (site.source, site.definition, site.call, site.computation) if loc is not None]
    for loc in locs:
        if not loc.file or not loc.line or not loc.file.endswith(".py"):
            continue
        if Path(loc.file).is_file() and is_user_file(loc.file, target):
            return index.construction(loc, finding.module)
    if model_level(finding):  # shown at the model's class (or factory) line, and suppressed there
        from normaudit.report.locations import absolute, target_file

        file = target_file(report)
        loc = model_line(str(absolute(file)), report.model.class_name, report.target.factory) if file else None
        if loc is not None and Path(loc.file).is_file() and is_user_file(loc.file, target):
            return loc
    return None


def plan(reports: Sequence[tuple[Report, Optional[Path]]]) -> tuple[dict[str, dict[int, list[Finding]]], NoqaResult]:
    """``resolved file -> line -> findings`` to suppress there, for the findings of ``reports`` (each with
    its target path, for :func:`is_user_file`), and a result listing the findings left."""
    index = SuppressionIndex()
    wanted: dict[str, dict[int, list[Finding]]] = {}
    result = NoqaResult()
    for report, target in reports:
        for f in report.findings:
            loc = None if f.rule_id == UNUSED_RULE else _finding_line(f, report, target, index)
            if loc is None:
                result.left.append(f)
            else:
                wanted.setdefault(index.key(loc.file), {}).setdefault(loc.line, []).append(f)
    return wanted, result


def _read(path: str) -> tuple[str, str]:
    """The text of a Python file and its encoding (PEP 263 cookie or BOM: ``utf-8-sig`` keeps a BOM)."""
    with open(path, "rb") as fh:
        raw = fh.read()
    encoding, _ = tokenize.detect_encoding(io.BytesIO(raw).readline)
    return raw.decode(encoding), encoding


def add_noqa(reports: Sequence[tuple[Report, Optional[Path]]]) -> NoqaResult:
    """Write suppression comments for every finding of ``reports`` that has a line in the user's files (see
    the module docstring). Raises UsageError, before writing anything, when a file to edit cannot be read,
    tokenized or written."""
    wanted, result = plan(reports)
    edits: list[tuple[str, bytes, int]] = []
    for path, lines in sorted(wanted.items()):
        try:
            text, encoding = _read(path)
            new, written, unplaced = edit_source(text, {ln: {f.rule_id for f in fs} for ln, fs in lines.items()})
        except (OSError, UnicodeDecodeError, SyntaxError, tokenize.TokenError) as err:
            raise UsageError(f"cannot add suppression comments: {err}", file=path) from None
        result.unplaced += [(path, line, cause) for line, cause in unplaced]
        result.left += [f for line, _ in unplaced for f in lines[line]]
        result.findings += sum(len(fs) for ln, fs in lines.items()) - sum(len(lines[ln]) for ln, _ in unplaced)
        if written:
            if not os.access(path, os.W_OK):
                raise UsageError("cannot add suppression comments: permission denied", file=path)
            edits.append((path, new.encode(encoding), written))
    for path, data, written in edits:
        try:
            with open(path, "r+b") as fh:  # in place: the file keeps its inode, mode and owner
                fh.write(data)
                fh.truncate()
        except OSError as err:
            raise UsageError(f"cannot add suppression comments: {err.strerror or err}", file=path) from None
        result.added += written
        result.files.append(path)
    return result
