"""The overhead model: line and envelope fitting, synthetic boots, and the JSON file plan
--model reads."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from guestagent.errors import InvalidArgument
from guestagent.host.sizing.model import (
    DEFAULT_MODEL,
    Envelope,
    Line,
    OverheadModel,
    fit_envelope,
    fit_line,
    fit_model,
    model_from_dict,
    model_to_dict,
    overhead_formula,
)
from guestagent.sizes import MIB
from tests.fakes.sizing import sample


def test_fit_line_recovers_an_exact_line() -> None:
    line = fit_line([(x * MIB, 30 * MIB + x * MIB // 50) for x in (306, 756, 1280, 2304)])
    assert line.slope == pytest.approx(0.02)
    assert line.intercept == pytest.approx(30 * MIB, abs=1)


def test_fit_line_lies_on_or_above_every_point() -> None:
    points = [(306 * MIB, 41 * MIB), (756 * MIB, 55 * MIB), (1280 * MIB, 57 * MIB)]
    line = fit_line(points)
    assert line.slope > 0
    assert all(line.at(x) >= y for x, y in points)
    assert any(line.at(x) - y < 1024 for x, y in points)  # and touches one


@pytest.mark.parametrize(
    ("points", "constant"),
    [
        ([(306, 55), (756, 50)], 55),  # a negative slope is noise: the largest value
        ([(306, 55)], 55),
        ([(306, 55), (306, 60)], 60),
    ],
)
def test_fit_line_degenerate_cases(points: list[tuple[int, int]], constant: int) -> None:
    assert fit_line(points) == Line(constant, 0.0)


def test_fit_line_needs_points() -> None:
    with pytest.raises(InvalidArgument):
        fit_line([])


def test_sample_kernel_ignores_the_unpopulated_tail_of_the_last_block() -> None:
    # 306 MiB fills three 128 MiB blocks only partly; the agent counts 384 MiB present.
    partial = sample(306, present_mib=384)
    assert partial.kernel == 30 * MIB + 306 * MIB // 50
    assert partial.vmm == 80 * MIB + 306 * MIB // 100


def test_fit_model_on_synthetic_boots() -> None:
    model = fit_model([sample(m) for m in (306, 406, 756, 1280, 2304)], "synthetic")
    assert isinstance(model.kernel, Line) and isinstance(model.vmm, Line)
    assert model.kernel.slope == pytest.approx(0.02, rel=1e-3)
    assert model.kernel.intercept == pytest.approx(30 * MIB, rel=1e-3)
    assert model.daemons == Line(50 * MIB, 0.0)
    assert model.vmm.slope == pytest.approx(0.01, rel=1e-3)
    assert model.vmm.intercept == pytest.approx(80 * MIB, rel=1e-3)
    assert len(model.samples) == 5


def test_model_json_round_trip() -> None:
    model = fit_model([sample(m) for m in (306, 756, 1280)], "synthetic")
    text = json.dumps(model_to_dict(model))
    assert model_from_dict(json.loads(text)) == model
    assert json.loads(text)["samples"][0]["kernel"] == model.samples[0].kernel


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"format": "other"}, "format"),
        ({**model_to_dict(DEFAULT_MODEL), "vmm": {"slope": 0.1}}, "vmm"),
        ({**model_to_dict(DEFAULT_MODEL), "samples": [{"vm_size": 1}]}, "samples"),
    ],
)
def test_model_from_dict_refuses_malformed_documents(
    document: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidArgument, match=message):
        model_from_dict(document)


# A reserve flat up to 756 MiB and steep above, as a confidential guest's (docs/sizing.md).
KINKED = [(306, 109), (406, 111), (756, 116), (1280, 190), (2304, 339), (4352, 636)]


def test_fit_envelope_follows_a_kink_within_a_mib() -> None:
    points = [(x * MIB, y * MIB) for x, y in KINKED]
    envelope = fit_envelope(points)
    assert isinstance(envelope, Envelope) and len(envelope.lines) == 2
    low, high = envelope.lines
    assert low.slope < 0.02 < 0.14 < high.slope
    assert all(0 <= envelope.at(x) - y <= MIB for x, y in points)
    # A single line through the same points lies tens of MiB above some of them.
    assert max(fit_line(points).at(x) - y for x, y in points) > 50 * MIB


def test_fit_envelope_keeps_one_line_when_that_fits_best() -> None:
    points = [(x * MIB, 30 * MIB + x * MIB // 50) for x in (306, 756, 1280, 2304)]
    assert isinstance(fit_envelope(points), Line)


@given(st.lists(st.tuples(st.integers(1, 1 << 40), st.integers(0, 1 << 32)), min_size=1))
def test_fit_envelope_lies_on_or_above_every_point(points: list[tuple[int, int]]) -> None:
    overhead = fit_envelope(points)
    assert all(overhead.at(x) >= y for x, y in points)


def test_model_json_round_trip_with_an_envelope_and_fitted_sizes() -> None:
    model = OverheadModel(
        kernel=Envelope((Line(100 * MIB, 0.015), Line(4 * MIB, 0.145))),
        daemons=Line(27 * MIB, 0.005),
        vmm=Line(13 * MIB, 0.0035),
        source="survey",
        fitted_sizes=(306 * MIB, 4352 * MIB),
    )
    document = json.loads(json.dumps(model_to_dict(model)))
    assert model_from_dict(document) == model
    assert model.sizes == (306 * MIB, 4352 * MIB)
    assert overhead_formula(model.kernel) == (
        "the larger of (100.0 MiB + 0.0150 x VM size) and (4.0 MiB + 0.1450 x VM size)"
    )
    with pytest.raises(InvalidArgument, match="kernel: lines is not a list"):
        model_from_dict({**document, "kernel": {"lines": []}})
