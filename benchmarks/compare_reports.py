"""Compare the JSON reports of two runs of normaudit, timings and paths aside: the oracle of a change that
means to keep behaviour (a refactor), over every report the test suite builds or every target of a zoo sweep.

usage:
    python -m pytest -q --dump-reports DIR_A        # at the commit before (tests/conftest.py writes the reports)
    python -m pytest -q --dump-reports DIR_B        # at the commit after
    python benchmarks/compare_reports.py DIR_A DIR_B [--show N]

    python benchmarks/compare_reports.py SWEEP_A SWEEP_B     # two `benchmarks/zoo/sweep.py --out` folders

A dump folder holds ``<test id>__<content hash>.json`` files (one per report a test built); a sweep folder
holds ``targets/<corpus>/<name>/report.json``. Reports are compared after :func:`normalise`: seconds set to 0,
temporary and checkout paths replaced by placeholders. Dumps are matched by test id (a test may build several
reports: compared as a set, since a dump names its files by content), sweeps by target. Prints the counts, then a unified diff of the first
``--show`` differing reports. Exit 0 when every report has an identical twin, 1 otherwise.
"""
from __future__ import annotations

import argparse
import collections
import difflib
import json
import re
import sys
from pathlib import Path
from typing import Any

_SECONDS = re.compile(r'"seconds":\s*-?[0-9.eE+-]+')
_TMP = re.compile(r"/tmp/pytest-of-[^/]+/pytest-\d+/")
#: a test's own folder below pytest's temporary root (named by the test, which a renamed test changes)
_TMP_DIR = re.compile(r"<tmp>/[^/\"]+/")
_ADDRESS = re.compile(r"0x[0-9a-f]{6,}")
#: a wall time inside a note ("graph re-interpreted, 0.02 s")
_NOTE_SECONDS = re.compile(r"\b\d+\.\d+ s\b")
#: the name a model file is imported under, derived from its absolute path (normaudit.loaders.pyfile)
_TARGET_MODULE = re.compile(r"normaudit_target_[0-9a-f]{8,}")


def normalise(text: str, root: Path) -> str:
    """The report text with what differs between two runs of the same code blanked: seconds (fields and wall
    times in notes), pytest's temporary folders, the folder compared (a sweep's ``--out``), object addresses and
    the module name a model file is imported under (derived from the checkout's path)."""
    text = _SECONDS.sub('"seconds": 0', text)
    text = _TMP.sub("<tmp>/", text)
    text = _TMP_DIR.sub("<tmp>/", text)
    text = text.replace(str(root.resolve()), "<root>")
    text = _ADDRESS.sub("0x?", text)
    text = _NOTE_SECONDS.sub("? s", text)
    text = _TARGET_MODULE.sub("normaudit_target_?", text)
    return text


def _drop(value: Any, path: list[str]) -> None:
    """Remove the field at ``path`` (dotted parts, ``*`` for every item of a list or value of a dict)."""
    if not path:
        return
    head, rest = path[0], path[1:]
    if head == "*":
        items = value if isinstance(value, list) else list(value.values()) if isinstance(value, dict) else []
        for item in items:
            _drop(item, rest)
    elif isinstance(value, dict) and head in value:
        if rest:
            _drop(value[head], rest)
        else:
            del value[head]


#: fields to remove before comparing (``--drop``): those a change adds on purpose
DROPS: list[list[str]] = []
#: ``--legacy-extra``: compare in the form of reports that kept their facts as untyped ``extra`` keys
LEGACY = {"on": False}
#: typed site fields and the ``extra`` key each replaced (``stream.*`` and ``batchnorm.*`` keep their names)
_SITE_FIELDS = ("eps_default", "eps_default_dtype", "inline", "cumulative_dim", "captured_part", "kind_guessed",
                "kind_basis")
#: fields reports of typed facts added without an ``extra`` key before them
_ADDED = (["model", "stream_end"], ["numerics", "producer", "cause_kind"], ["numerics", "before", "*", "cause_kind"])


def _kept(facts: dict) -> dict:
    """The facts whose value says something: None, False and empty lists were absent keys before."""
    return {k: v for k, v in facts.items() if v is not None and v is not False and v != []}


def _legacy_site(site: dict) -> None:
    """A site's typed facts back under ``extra`` as the untyped keys they replaced (:data:`_SITE_FIELDS`,
    ``stream``, ``batchnorm`` (its ``momentum`` too), ``lrn``; ``gain_form`` only where the formula does not
    give the gain, as before), values that say nothing dropped on both sides."""
    extra = dict(site.get("extra") or {})
    for key in _SITE_FIELDS:
        if key in site:
            extra[key] = site.pop(key)
    for family in ("stream", "batchnorm"):
        extra.update(site.pop(family, None) or {})
    lrn = site.pop("lrn", None)
    if lrn:
        extra.update(lrn)
    form = site.pop("gain_form", None)
    gain = (site.get("formula") or {}).get("gain")
    if gain in (None, "unknown") or "gain_form" in extra:
        extra.setdefault("gain_form", form)
    site["extra"] = _kept(extra)


def _legacy(data: dict) -> None:
    """A report in the form of untyped ``extra`` keys (:func:`_legacy_site`, the model's GroupNorm config and
    causal attention), whichever form it has."""
    for path in _ADDED:
        _drop(data, list(path))
    for site in data.get("sites") or []:
        _legacy_site(site)
    model = data.get("model") or {}
    extra = dict(model.get("extra") or {})
    for key in ("groupnorm_config", "causal_attention"):
        if key in model:
            extra[key] = model.pop(key)
    model["extra"] = _kept(extra)


#: ``--blank-test-lines``: line numbers in the test files themselves (models defined in a test), which move
#: when a test file is edited; fixture files keep theirs
_TEST_LINE = re.compile(r'("file": "<repo>/tests/)test_[^"/]*\.py(",\s*"line": )\d+')
_TEST_AT = re.compile(r"test_\w+\.py:\d+")
BLANK_TEST_LINES = {"on": False}


def _pretty(text: str) -> str:
    if BLANK_TEST_LINES["on"]:
        text = _TEST_AT.sub("test_?.py:?", _TEST_LINE.sub(r"\g<1>test_?.py\g<2>0", text))
    try:
        data = json.loads(text)
    except ValueError:
        return text
    for path in DROPS:
        _drop(data, path)
    if LEGACY["on"] and isinstance(data, dict):
        _legacy(data)
    return json.dumps(data, indent=1, sort_keys=True)


def load(folder: Path) -> dict[str, list[str]]:
    """``{key: [normalised report text, ...]}``: a sweep's reports by ``corpus/name``, a dump's by test id."""
    out: dict[str, list[str]] = collections.defaultdict(list)
    sweep = sorted(folder.glob("targets/*/*/report.json"))
    if sweep:
        for path in sweep:
            out[f"{path.parent.parent.name}/{path.parent.name}"].append(
                _pretty(normalise(path.read_text(errors="replace"), folder)))
        return out
    for path in sorted(folder.glob("*.json")):
        key = path.stem.rpartition("__")[0] or path.stem
        out[key].append(_pretty(normalise(path.read_text(errors="replace"), folder)))
    return out


def compare(a: dict[str, list[str]], b: dict[str, list[str]]) -> tuple[dict[str, int], list[tuple[str, str, str]]]:
    """Counts (keys in both, identical, differing, only before, only after) and the differing pairs
    ``(key, before, after)`` (per key, the reports without an identical twin, paired in order)."""
    counts = collections.Counter()
    pairs: list[tuple[str, str, str]] = []
    for key in sorted(set(a) | set(b)):
        if key not in b:
            counts["only before"] += 1
            continue
        if key not in a:
            counts["only after"] += 1
            continue
        counts["keys in both"] += 1
        left, right = set(a[key]), set(b[key])
        lost, gained = sorted(left - right), sorted(right - left)
        if not lost and not gained:
            counts["identical"] += 1
            continue
        counts["differing"] += 1
        for i in range(max(len(lost), len(gained))):
            pairs.append((key, lost[i] if i < len(lost) else "", gained[i] if i < len(gained) else ""))
    return dict(counts), pairs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--show", type=int, default=5, help="diffs to print (default 5)")
    parser.add_argument("--keys", action="store_true", help="list every differing key")
    parser.add_argument("--drop", action="append", default=[], metavar="FIELD",
                        help="a dotted field to remove from both sides first (a field added on purpose), "
                             "'*' for every list item or dict value: model.stream_end, sites.*.extra.inline")
    parser.add_argument("--legacy-extra", action="store_true",
                        help="compare with reports that held their facts as untyped extra keys: the typed fields "
                             "are mapped back to those keys on both sides")
    parser.add_argument("--blank-test-lines", action="store_true",
                        help="blank the file names and line numbers of tests/test_*.py (models a test defines move with its "
                             "edits and renames)")
    args = parser.parse_args(argv)
    BLANK_TEST_LINES["on"] = args.blank_test_lines
    DROPS[:] = [d.split(".") for d in args.drop]
    LEGACY["on"] = args.legacy_extra
    a, b = load(args.before), load(args.after)
    counts, pairs = compare(a, b)
    reports = (sum(map(len, a.values())), sum(map(len, b.values())))
    print(f"reports: {reports[0]} before, {reports[1]} after; " + ", ".join(f"{k}: {v}" for k, v in counts.items()))
    only = sorted(set(a) ^ set(b))
    lost = {t for k in only if k in a for t in a[k]}
    gained = {t for k in only if k in b for t in b[k]}
    unmatched = sorted(lost - gained)
    if only:  # renamed tests: their reports matched by content
        print(f"reports of keys on one side only: {len(lost)} before, {len(gained)} after; identical by content: "
              f"{len(lost & gained)}; before without an identical report after: {len(unmatched)}")
    for text in unmatched[:20]:
        target = json.loads(text).get("target", {}).get("path") if text.startswith("{") else None
        print(f"  no twin after: {target}")
    if args.keys:
        for key in sorted({p[0] for p in pairs}):
            print(f"  differs: {key}")
    for key, left, right in pairs[:args.show]:
        print(f"--- {key}")
        diff = difflib.unified_diff(left.splitlines(), right.splitlines(), "before", "after", n=2, lineterm="")
        print("\n".join(list(diff)[:80]))
    return 0 if not pairs and not unmatched else 1


if __name__ == "__main__":
    sys.exit(main())
