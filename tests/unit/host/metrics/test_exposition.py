"""The text exposition format: what a scraper reads, checked by prometheus_client's parser."""

from __future__ import annotations

import math

from prometheus_client.parser import text_string_to_metric_families

from guestagent.host.metrics.exposition import exposition, number
from guestagent.host.metrics.families import Family, Sample


def test_samples_labels_and_escapes_read_back() -> None:
    families = [
        Family(
            "a_bytes",
            "gauge",
            "help with \\ and\nnewline",
            ("cgroup",),
            (Sample(('pod/"x"\\y\n',), 3.0), Sample(("b",), math.inf)),
        ),
        Family("b_total", "counter", "counted", (), (Sample((), 7.0),)),
        Family("empty", "gauge", "no samples: absent", (), ()),
    ]
    text = exposition(families)
    assert "empty" not in text
    parsed = {f.name: f for f in text_string_to_metric_families(text)}
    (first, second) = parsed["a_bytes"].samples
    assert first.labels == {"cgroup": 'pod/"x"\\y\n'} and first.value == 3.0
    assert math.isinf(second.value)
    assert parsed["a_bytes"].documentation == "help with \\ and\nnewline"
    assert parsed["b"].type == "counter" and parsed["b"].samples[0].value == 7.0


def test_numbers() -> None:
    assert [number(v) for v in (1, 0.5, math.inf, -math.inf, math.nan)] == [
        "1.0",
        "0.5",
        "+Inf",
        "-Inf",
        "NaN",
    ]
    assert exposition([]) == ""
