from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from guestagent.errors import InvalidArgument
from guestagent.ops.workingset.policy import (
    CLEAN_STEPS_PER_BACKOFF,
    MAX_HOLD_INTERVALS,
    ControllerState,
    Mode,
    ReclaimPolicy,
    Sample,
    StepKind,
    decide,
    stop_step_after_chunk,
    validate_policy,
)
from guestagent.sizes import MIB

POLICY = ReclaimPolicy(stall_target_us=1000, max_step_fraction=0.1, refault_guard_fraction=0.01)
PAGE = 4096


def sample(
    stall: int = 0,
    refault: int = 0,
    current: int = 100 * MIB,
    protected: int = 0,
    reclaimed: int = 0,
    low_yield: str = "",
    cold: int = 0,
) -> Sample:
    return Sample(stall, refault, current, protected, reclaimed, low_yield, cold)


@pytest.mark.parametrize(
    ("stall_us", "step"),
    [
        (0, 10 * MIB),  # Full slack: the whole max step.
        (500, 5 * MIB),  # Half the target used: half the step.
        (750, int(2.5 * MIB)),
        (1000, 0),  # At the target: no slack, no step, but no back-off either.
    ],
)
def test_slack_sets_the_step(stall_us: int, step: int) -> None:
    decision = decide(sample(stall=stall_us), POLICY, ControllerState(), PAGE)
    assert decision.step_bytes == step - step % PAGE
    assert decision.state.mode == Mode.PROBING


@pytest.mark.parametrize(
    ("refault", "step"),
    [(0, 10 * MIB), (int(0.5 * MIB), 5 * MIB), (MIB, 0)],  # Guard: 1 % of 100 MiB.
)
def test_refaults_shrink_the_step(refault: int, step: int) -> None:
    assert decide(sample(refault=refault), POLICY, ControllerState(), PAGE).step_bytes == step


@pytest.mark.parametrize(
    ("stall", "refault", "reason"),
    [(1001, 0, "stall 1001 us over target 1000 us"), (0, 2 * MIB, "refaults 2097152 B over")],
)
def test_over_the_target_backs_off(stall: int, refault: int, reason: str) -> None:
    decision = decide(sample(stall=stall, refault=refault), POLICY, ControllerState(), PAGE)
    assert decision.step_bytes == 0
    assert decision.state.mode == Mode.BACKING_OFF
    assert reason in decision.state.why
    assert (decision.state.hold, decision.state.backoffs) == (1, 1)


def test_back_off_holds_grow_and_shrink_again() -> None:
    state = ControllerState()
    holds = []
    for _ in range(8):
        state = decide(sample(stall=5000), POLICY, state, PAGE).state
        holds.append(state.hold)
    assert holds == [1, 4, 16, 32, 32, 32, 32, 32]
    assert max(holds) == MAX_HOLD_INTERVALS
    # Calm intervals count the hold down, then a step; CLEAN_STEPS_PER_BACKOFF clean samples
    # after steps shorten the next hold.
    for left in range(31, -1, -1):
        decision = decide(sample(), POLICY, state, PAGE)
        state = decision.state
        assert decision.step_bytes == 0 and state.hold == left
    backoffs = state.backoffs
    for judged in range(CLEAN_STEPS_PER_BACKOFF + 1):  # The first step has none to judge.
        decision = decide(sample(reclaimed=state.last_step), POLICY, state, PAGE)
        # Eight back-offs not worked off: 1/4**8 of the full step is under a page, so a page.
        assert decision.step_bytes == PAGE and decision.state.stepped
        state = decision.state
        worked_off = 1 if judged == CLEAN_STEPS_PER_BACKOFF else 0
        assert state.backoffs == backoffs - worked_off
    # The probe grows BACKOFF_FACTOR-fold once every CLEAN_STEPS_PER_BACKOFF clean steps.
    probes: list[int] = []
    state = ControllerState(backoffs=3)
    for _ in range(3 * CLEAN_STEPS_PER_BACKOFF + 1):
        decision = decide(sample(reclaimed=probes[-1] if probes else 0), POLICY, state, PAGE)
        probes.append(decision.step_bytes)
        state = decision.state
    full = 10 * MIB
    levels = [full // 64 - (full // 64) % PAGE, full // 16, full // 4]
    assert probes == [p for p in levels for _ in range(CLEAN_STEPS_PER_BACKOFF)] + [full]


def test_a_back_off_restarts_the_count_of_clean_steps() -> None:
    state = ControllerState(backoffs=2)
    for _ in range(CLEAN_STEPS_PER_BACKOFF):  # The first steps; each later one judges a step.
        decision = decide(sample(reclaimed=state.last_step), POLICY, state, PAGE)
        state = decision.state
    assert state.clean_steps == CLEAN_STEPS_PER_BACKOFF - 1
    state = decide(sample(stall=5000), POLICY, state, PAGE).state
    assert (state.backoffs, state.clean_steps, state.hold) == (3, 0, 16)


@pytest.mark.parametrize(("reclaimed", "backs_off"), [(0, True), (MIB - 1, True), (MIB, False)])
def test_a_step_that_got_little_backs_off(reclaimed: int, backs_off: bool) -> None:
    state = ControllerState(last_step=4 * MIB)
    decision = decide(sample(reclaimed=reclaimed), POLICY, state, PAGE)
    assert (decision.state.mode == Mode.BACKING_OFF) is backs_off
    if backs_off:
        assert f"the last step got {reclaimed} B of {4 * MIB} B" in decision.state.why


def test_a_step_stopped_at_the_working_set_backs_off() -> None:
    state = ControllerState(last_step=4 * MIB)
    why = "the kernel stole 10 of the 100 pages it scanned: the rest is referenced"
    decision = decide(sample(reclaimed=4 * MIB, low_yield=why), POLICY, state, PAGE)
    assert decision.step_bytes == 0 and decision.state.mode == Mode.BACKING_OFF
    assert f"the last step stopped early: {why}" in decision.state.why


LOW = (1025, 256)  # Under a quarter of what the kernel scanned.


@pytest.mark.parametrize(
    ("chunks", "spent", "why", "low_yield"),
    [
        (((256, 256),), 0.01, "", False),
        (((256, 256), (1024, 256)), 0.01, "", False),  # A quarter: still worth it.
        ((LOW,), 0.01, "", False),  # One low chunk: maybe referenced pages sorted once.
        ((LOW, (256, 256)), 0.01, "", False),
        ((LOW, (256, 256), LOW), 0.01, "", False),
        (((256, 256), LOW, LOW), 0.01, "stole 512 of the 2050 pages it scanned", True),
        (((None, None), (None, None)), 0.01, "", False),  # No pgscan/pgsteal.
        (((0, 0), (0, 0)), 0.01, "", False),
        (((256, 256),), 1.01, "memory.reclaim took 1010 ms, over 1000 ms", False),
    ],
)
def test_a_chunk_verdict(
    chunks: tuple[tuple[int | None, int | None], ...], spent: float, why: str, low_yield: bool
) -> None:
    said, is_low_yield = stop_step_after_chunk(chunks, 0, len(chunks) * MIB, spent, 1.0, PAGE)
    assert why in said and bool(said) is bool(why)
    assert is_low_yield is low_yield


@pytest.mark.parametrize(
    ("refaulted", "done", "stops"),
    [(0, MIB, False), (64, MIB, False), (65, MIB, True), (65, 2 * MIB, False)],
)
def test_refaults_while_a_step_runs_stop_it(refaulted: int, done: int, stops: bool) -> None:
    said, is_low_yield = stop_step_after_chunk(((256, 256),), refaulted, done, 0.01, 1.0, PAGE)
    assert bool(said) is stops and is_low_yield is stops
    if stops:
        assert f"{refaulted} pages refaulted while it reclaimed {done} B" in said


def test_refault_guard_off_ignores_refaults() -> None:
    policy = replace(POLICY, refault_guard_fraction=0.0)
    assert decide(sample(refault=90 * MIB), policy, ControllerState(), PAGE).step_bytes == 10 * MIB


@pytest.mark.parametrize(
    ("current", "floor", "protected", "step", "mode"),
    [
        (100 * MIB, 95 * MIB, 0, 5 * MIB, Mode.PROBING),  # The step stops at the floor.
        (100 * MIB, 0, 98 * MIB, 2 * MIB, Mode.PROBING),  # memory.low/min is a floor too.
        (100 * MIB, 100 * MIB, 0, 0, Mode.AT_FLOOR),
        (100 * MIB, 0, 200 * MIB, 0, Mode.AT_FLOOR),
        (100 * MIB + 100, 100 * MIB, 0, 0, Mode.AT_FLOOR),  # Less than a page above it.
    ],
)
def test_floor(current: int, floor: int, protected: int, step: int, mode: Mode) -> None:
    policy = replace(POLICY, floor_bytes=floor)
    decision = decide(sample(current=current, protected=protected), policy, ControllerState(), PAGE)
    assert (decision.step_bytes, decision.state.mode) == (step, mode)


policies = st.builds(
    ReclaimPolicy,
    interval_ms=st.just(1000),
    stall_target_us=st.integers(1, 999_999),
    max_step_fraction=st.floats(0.0001, 0.5),
    floor_bytes=st.integers(0, 1 << 40),
    anon=st.booleans(),
    refault_guard_fraction=st.floats(0.0, 1.0),
)
samples = st.builds(
    Sample,
    stall_us=st.integers(0, 10_000_000),
    refault_bytes=st.integers(0, 1 << 40),
    current=st.integers(0, 1 << 40),
    protected=st.integers(0, 1 << 40),
    reclaimed_bytes=st.integers(0, 1 << 30),
    low_yield=st.sampled_from(["", "the kernel stole 1 of the 8 pages it scanned"]),
)
states = st.builds(
    ControllerState,
    mode=st.sampled_from(Mode),
    hold=st.integers(0, MAX_HOLD_INTERVALS),
    backoffs=st.integers(0, 10),
    last_step=st.integers(0, 1 << 30),
    clean_steps=st.integers(0, CLEAN_STEPS_PER_BACKOFF - 1),
)


@given(samples, policies, states)
def test_never_more_than_the_max_step_nor_below_the_floor(
    s: Sample, policy: ReclaimPolicy, state: ControllerState
) -> None:
    step = decide(s, policy, state, PAGE).step_bytes
    assert 0 <= step <= policy.max_step_fraction * s.current
    assert step % PAGE == 0
    if step:
        assert s.current - step >= max(policy.floor_bytes, s.protected)
        assert s.stall_us <= policy.stall_target_us


@given(samples, policies, states)
def test_back_offs_wear_off_one_at_a_time(
    s: Sample, policy: ReclaimPolicy, state: ControllerState
) -> None:
    after = decide(s, policy, state, PAGE).state
    assert after.backoffs >= state.backoffs - 1
    if after.backoffs < state.backoffs:
        assert state.stepped and state.clean_steps == CLEAN_STEPS_PER_BACKOFF - 1
        assert after.clean_steps == 0


@given(samples, policies, states)
def test_over_target_never_steps(s: Sample, policy: ReclaimPolicy, state: ControllerState) -> None:
    decision = decide(replace(s, stall_us=policy.stall_target_us + 1), policy, state, PAGE)
    assert decision.step_bytes == 0 and decision.state.mode == Mode.BACKING_OFF
    assert 1 <= decision.state.hold <= MAX_HOLD_INTERVALS


@pytest.mark.parametrize(
    ("policy", "named"),
    [
        (ReclaimPolicy(interval_ms=99), "interval_ms 99 is outside [100, 600000]"),
        (ReclaimPolicy(stall_target_us=0), "stall_target_us 0 is outside [1, 999999]"),
        (ReclaimPolicy(stall_target_us=1_000_000), "stall_target_us 1000000"),
        (ReclaimPolicy(max_step_fraction=0.6), "max_step_fraction 0.6 is outside"),
        (ReclaimPolicy(max_step_fraction=float("nan")), "max_step_fraction nan"),
        (ReclaimPolicy(refault_guard_fraction=-0.1), "refault_guard_fraction -0.1"),
        (ReclaimPolicy(floor_bytes=-1), "floor_bytes -1 is outside"),
        (ReclaimPolicy(cold_after_ms=999), "cold_after_ms 999 is outside [1000, 86400000]"),
    ],
)
def test_out_of_range_names_value_and_range(policy: ReclaimPolicy, named: str) -> None:
    with pytest.raises(InvalidArgument, match=named.replace("[", r"\[").replace("]", r"\]")):
        validate_policy(policy)


def test_defaults_are_valid() -> None:
    assert validate_policy(ReclaimPolicy()) == ReclaimPolicy()


def test_what_the_ages_call_cold_goes_at_once_whatever_the_probe_would_be() -> None:
    # Half the stall target used: a probe would be half a step (5 MiB); the cold 60 MiB goes.
    decision = decide(sample(stall=500, cold=60 * MIB), POLICY, ControllerState(), PAGE)
    assert (decision.kind, decision.step_bytes) == (StepKind.EVICT_COLD, 60 * MIB)
    assert decision.state.last_kind == StepKind.EVICT_COLD
    assert "evicting 62914560 B idle at least 60 s" in decision.state.why


@pytest.mark.parametrize(
    ("cold", "kind", "step"),
    [
        (12 * 1024, StepKind.PROBE, 0),  # A trickle of cold pages: no write for it.
        (MIB - PAGE, StepKind.PROBE, 0),
        (MIB, StepKind.EVICT_COLD, MIB),  # A chunk: the kernel's least write is worth it.
    ],
)
def test_less_than_a_chunk_of_cold_waits_for_more(cold: int, kind: StepKind, step: int) -> None:
    with_ages = replace(sample(cold=cold), cooling_bytes=cold)
    decision = decide(with_ages, POLICY, ControllerState(), PAGE)
    assert (decision.kind, decision.step_bytes) == (kind, step), decision.state.why


def test_cold_is_evicted_down_to_the_floor_only() -> None:
    decision = decide(sample(cold=60 * MIB, protected=70 * MIB), POLICY, ControllerState(), PAGE)
    assert (decision.kind, decision.step_bytes) == (StepKind.EVICT_COLD, 30 * MIB)


@pytest.mark.parametrize(
    ("s", "state"),
    [
        (sample(stall=1001, cold=60 * MIB), ControllerState()),  # Over the stall target.
        (sample(refault=2 * MIB, cold=60 * MIB), ControllerState()),  # Over the refault guard.
        (sample(cold=60 * MIB), ControllerState(hold=3, backoffs=2)),  # Holding.
    ],
)
def test_the_stall_budget_and_the_refault_guard_stop_eviction_too(
    s: Sample, state: ControllerState
) -> None:
    decision = decide(s, POLICY, state, PAGE)
    assert decision.step_bytes == 0 and decision.state.mode == Mode.BACKING_OFF


def test_an_eviction_cut_short_by_its_time_is_no_sign_of_the_working_set() -> None:
    # An eviction asked for 300 MiB and its interval's writes took 40 MiB; 260 are still cold.
    state = ControllerState(last_step=300 * MIB, last_kind=StepKind.EVICT_COLD)
    decision = decide(sample(reclaimed=40 * MIB, cold=260 * MIB), POLICY, state, PAGE)
    assert (decision.kind, decision.step_bytes) == (StepKind.EVICT_COLD, 100 * MIB)
    # Nothing cold left: a probe, at full size.
    decision = decide(sample(reclaimed=40 * MIB), POLICY, state, PAGE)
    assert (decision.kind, decision.step_bytes) == (StepKind.PROBE, 10 * MIB)


def test_an_eviction_that_met_the_working_set_backs_off() -> None:
    state = ControllerState(last_step=300 * MIB, last_kind=StepKind.EVICT_COLD)
    why = "20 pages refaulted while it reclaimed 40960 B: it reached the working set"
    decision = decide(sample(reclaimed=40960, low_yield=why, cold=MIB), POLICY, state, PAGE)
    assert decision.step_bytes == 0 and decision.state.mode == Mode.BACKING_OFF


@pytest.mark.parametrize(
    ("cooling", "step"),
    [
        (None, 10 * MIB),  # No ages: the step alone bounds a probe.
        (64 * MIB, 10 * MIB),
        (3 * MIB + 100, 3 * MIB),  # Only what the ages say is cooling.
        (MIB, MIB),
        (MIB - PAGE, 0),  # Under a chunk: not worth a probe.
        (0, 0),  # All of it used since the last aging: nothing to look for.
    ],
)
def test_with_ages_a_probe_looks_only_for_what_is_cooling(cooling: int | None, step: int) -> None:
    s = replace(sample(), cooling_bytes=cooling)
    decision = decide(s, POLICY, ControllerState(), PAGE)
    assert (decision.kind, decision.step_bytes) == (StepKind.PROBE, step)
    assert decision.state.mode == Mode.PROBING
    if step == 0:
        assert "nothing worth a probe" in decision.state.why
