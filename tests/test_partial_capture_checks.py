"""``model.partial_capture``: the checks an audit without a whole-model graph did not run, and the sites whose
placement no capture saw (the models of the NK102 fixtures)."""
from __future__ import annotations

from pathlib import Path


from conftest import audit_file

FIXTURES = Path(__file__).parent / "fixtures" / "capture"
WHOLE = ["final norm", "norms never applied", "size probe"]


def test_parts_name_the_checks_and_the_part_without_a_stream():
    report = audit_file(FIXTURES / "NK102_1.py")
    pc = report.model.partial_capture
    assert report.capture.method == "parts"
    assert (pc.method, pc.parts, pc.sites, pc.unplaced) == ("parts", 3, 3, ["final"])
    assert [(c.name, c.rules) for c in pc.checks] == [
        ("final norm", ["NP101"]), ("norms never applied", ["NP107"]), ("size probe", ["NL105"]),
        ("placement of 1 norm(s)", ["NP102", "NP103", "NP104", "NP105", "NP106", "NP109"])]
    assert pc.reason.startswith("TraceError: Proxy object cannot be iterated")
    assert len(pc.reason) == 160 and pc.reason.endswith("...")


def test_batch_probe_is_listed_when_asked_for():
    pc = audit_file(FIXTURES / "NK102_1.py", probes=["batch"]).model.partial_capture
    assert [c.name for c in pc.checks] == WHOLE + ["batch probe", "placement of 1 norm(s)"]
    assert pc.checks[3].rules == ["NL106", "NB108"]


def test_module_walk_leaves_every_site_unplaced():
    report = audit_file(FIXTURES / "NK102_2.py")
    pc = report.model.partial_capture
    assert report.capture.method == "module_walk"
    assert (pc.method, pc.parts, pc.sites, pc.unplaced) == ("module_walk", 0, 1, ["norm"])
    assert pc.reason == "TraceError: symbolically traced variables cannot be used as inputs to control flow"


def test_whole_graph_has_none():
    report = audit_file(FIXTURES / "NK102_3.py")
    assert report.capture.method in ("symbolic_trace", "export") and report.model.partial_capture is None
