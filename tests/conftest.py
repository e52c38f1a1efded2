from pathlib import Path

import pytest

from tests.fakes.root import FakeRoot, make_fake_root


@pytest.fixture
def fake_root(tmp_path: Path) -> FakeRoot:
    return make_fake_root(tmp_path / "root")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say how much hostile input the fuzz tests tried, so every CI log reports it."""
    stats = terminalreporter.stats
    ran = [r for r in stats.get("passed", []) + stats.get("failed", []) if "fuzz" in r.nodeid]
    if not ran:
        return
    from tests.integration.test_fuzz_handlers import HANDLER_EXAMPLES
    from tests.unit.test_fuzz_parsers import FUZZ_EXAMPLES

    parsers = sum("test_fuzz_parsers" in r.nodeid for r in ran)
    handlers = sum("test_fuzz_handlers" in r.nodeid for r in ran)
    terminalreporter.write_line(
        f"fuzz: {parsers} parser tests x {FUZZ_EXAMPLES} inputs, "
        f"{handlers} RPC groups x {HANDLER_EXAMPLES} requests "
        f"({parsers * FUZZ_EXAMPLES + handlers * HANDLER_EXAMPLES} examples)"
    )
