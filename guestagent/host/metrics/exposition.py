"""Families as Prometheus' text exposition format (version 0.0.4): `# HELP`, `# TYPE` and one
line a sample, label values and help escaped as the format says. Pure. Written here rather
than taken from prometheus_client: it is all the host's tools use of it, and that library's
import (with the ssl its exposition module brings) cost the node daemon about 2 MiB of its
memory (docs/measurements.md, the node daemon)."""

from __future__ import annotations

import math
from collections.abc import Iterable

from guestagent.host.metrics.families import Family

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def number(value: float) -> str:
    """A sample's value as the format writes it: +Inf, -Inf, NaN, else Python's repr."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def exposition(families: Iterable[Family]) -> str:
    """The text a scrape gets; a family without samples is left out (absent, not empty)."""
    lines = []
    for family in families:
        if not family.samples:
            continue
        lines.append(f"# HELP {family.name} {_help(family.help)}")
        lines.append(f"# TYPE {family.name} {family.kind}")
        for sample in family.samples:
            labels = ",".join(
                f'{name}="{_label(value)}"'
                for name, value in zip(family.label_names, sample.label_values, strict=True)
            )
            name = f"{family.name}{{{labels}}}" if labels else family.name
            lines.append(f"{name} {number(sample.value)}")
    return "\n".join(lines) + "\n" if lines else ""
