"""Report admission: a few reports at a time, in turn; none while a state-changing call starts,
then one."""

from __future__ import annotations

import asyncio

from guestagent.agent.admission import ReportAdmission


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


class Reports:
    """Reports that hold their slot until released, noting the order they got it in."""

    def __init__(self, admission: ReportAdmission) -> None:
        self.admission = admission
        self.running: list[int] = []
        self.release: dict[int, asyncio.Event] = {}

    async def report(self, n: int) -> None:
        self.release[n] = asyncio.Event()
        async with self.admission.report():
            self.running.append(n)
            await self.release[n].wait()

    async def holding_and_waiting(self) -> tuple[asyncio.Task[None], asyncio.Task[None]]:
        """Report 0 holding the one slot, report 1 queued behind it."""
        holder = asyncio.create_task(self.report(0))
        await settle()
        waiter = asyncio.create_task(self.report(1))
        await settle()
        return holder, waiter


async def test_reports_beyond_the_slots_wait_in_turn() -> None:
    reports = Reports(ReportAdmission(2))
    tasks = [asyncio.create_task(reports.report(n)) for n in range(5)]
    await settle()
    assert reports.running == [0, 1]
    reports.release[1].set()
    await settle()
    assert reports.running == [0, 1, 2]
    for n in range(5):
        reports.release[n].set()
        await settle()
    await asyncio.gather(*tasks)
    assert reports.running == [0, 1, 2, 3, 4]


async def test_no_report_starts_while_a_state_changing_call_runs() -> None:
    admission = ReportAdmission(3, hold_s=60)
    reports = Reports(admission)
    changing = asyncio.Event()
    done = asyncio.Event()

    async def change() -> None:
        async with admission.change():
            changing.set()
            await done.wait()

    changer = asyncio.create_task(change())
    await changing.wait()
    tasks = [asyncio.create_task(reports.report(n)) for n in range(3)]
    await settle()
    assert reports.running == []
    done.set()
    await changer
    await settle()
    assert reports.running == [0, 1, 2]  # Its end gives the slots back.
    for n in range(3):
        reports.release[n].set()
    await asyncio.gather(*tasks)


async def test_changes_past_the_hold_let_one_report_through() -> None:
    admission = ReportAdmission(3, hold_s=0.01)
    reports = Reports(admission)
    done = asyncio.Event()

    async def change() -> None:
        async with admission.change():
            await done.wait()

    changers = [asyncio.create_task(change()) for _ in range(2)]
    tasks = [asyncio.create_task(reports.report(n)) for n in range(3)]
    await settle()
    assert reports.running == []
    async with asyncio.timeout(5):  # The hold ends at 10 ms: one report goes, the rest wait.
        while not reports.running:
            await asyncio.sleep(0.001)
    await settle()
    assert reports.running == [0]
    done.set()
    await asyncio.gather(*changers)
    await settle()
    assert reports.running == [0, 1, 2]
    for n in range(3):
        reports.release[n].set()
    await asyncio.gather(*tasks)


async def test_a_report_cancelled_while_waiting_takes_no_slot() -> None:
    admission = ReportAdmission(1)
    reports = Reports(admission)
    first = asyncio.create_task(reports.report(0))
    second = asyncio.create_task(reports.report(1))
    third = asyncio.create_task(reports.report(2))
    await settle()
    second.cancel()
    await settle()
    reports.release[0].set()
    await settle()
    assert reports.running == [0, 2]
    reports.release[2].set()
    await asyncio.gather(first, third)
    assert second.cancelled()
    assert admission.open_slots == 1


async def test_a_slot_given_as_its_waiter_is_cancelled_goes_back() -> None:
    admission = ReportAdmission(1)
    reports = Reports(admission)
    first, second = await reports.holding_and_waiting()
    reports.release[0].set()
    while not first.done():  # The first ends and hands its slot to the second...
        await asyncio.sleep(0)
    assert reports.running == [0] and admission.open_slots == 0
    second.cancel()  # ...which is cancelled before it runs.
    await asyncio.gather(second, return_exceptions=True)
    assert admission.open_slots == 1
    third = asyncio.create_task(reports.report(2))
    await settle()
    assert reports.running[-1] == 2
    reports.release[2].set()
    await third


async def test_a_waiter_cancelled_and_dropped_by_a_release_before_it_runs_leaves_quietly() -> None:
    # The hostile flood's streams (CI, 2026-12-07): a stream's task is cancelled while it
    # waits; before it runs, a report ends and its wake-up drops the cancelled waiter; the
    # task then must not look for it in the queue again.
    admission = ReportAdmission(1)
    reports = Reports(admission)
    holder, waiter = await reports.holding_and_waiting()
    reports.release[0].set()  # The holder runs first: its slot's release wakes the queue ...
    waiter.cancel()  # ... whose waiter is cancelled by then, its task run after.
    await holder
    results = await asyncio.gather(waiter, return_exceptions=True)
    assert isinstance(results[0], asyncio.CancelledError), results
    assert admission.open_slots == 1 and reports.running == [0]
    async with asyncio.timeout(1), admission.report():
        pass  # The slot is free for the next.
