"""The thrash section (issue 56): tests/workloads/thrash.py's whole-guest thrash in a guest of
its own, GetMemoryInfo's p99 through it against idle and a stream's gaps, with the verdicts.
`python -m tests.bench.thrash --out FILE.json` runs it alone."""

from __future__ import annotations

from typing import Any

from tests.bench import alone
from tests.bench.vm import booted
from tests.vm import pace
from tests.workloads.thrash import CONFIG, measure_thrash


def measure_thrash_section() -> dict[str, Any]:
    with booted(CONFIG) as (vm, agent):
        speed = pace.measure(vm)
        return {"pace": speed.factor, **measure_thrash(vm, agent, speed.scale)}


if __name__ == "__main__":
    args = alone.parser(__doc__, "thrash").parse_args()
    raise SystemExit(alone.write(args.out, measure_thrash_section()))
