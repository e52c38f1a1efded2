"""`guestctl give-back`'s result as text: the step in the VMM's own terms, the guest's figures
before and after, and what the VMM's RSS gave back."""

from __future__ import annotations

from typing import Any

from guestagent.host.display import GIVEBACK_FIGURES, mib
from guestagent.host.giveback.oneshot import GiveBack, GuestFigures, VmmRss
from guestagent.host.giveback.plan import BALLOON, UNOBSERVED, balloon_shown


def _figure_text(name: str, figure: dict[str, Any]) -> str:
    return f"  {name} {mib(int(figure.get('bytes', 0)))}: {figure.get('reason', '')}"


def _guest_text(side: GuestFigures) -> list[str]:
    lines = [f"  MemTotal {mib(side.mem_total_bytes)}"]
    for name in GIVEBACK_FIGURES:
        if name in side.giveback:
            lines.append(_figure_text(name, side.giveback[name]))
    for target in side.giveback.get("virtio_mem", []):
        figure = target.get("safe_requested_size", {})
        lines.append(_figure_text(f"{target['device']} safe_requested_size", figure))
    return lines


def _rss_text(rss: VmmRss) -> str:
    text = mib(rss.rss_bytes)
    if not rss.tcg_code_rss_bytes:
        return text
    return f"{text} ({mib(rss.guest_bytes)} without TCG's translated code)"


def _compact_text(what: str, compact: dict[str, Any]) -> str:
    before = mib(int(compact.get("free_huge_bytes_before", 0)))
    after = mib(int(compact.get("free_huge_bytes_after", 0)))
    return f"{what}: free in 2 MiB blocks {before} -> {after}"


def _stop_text(before: GuestFigures, at_stop: GuestFigures) -> str:
    """The guest when the device stood still: what was free and whether it was still making
    room (pages swapped out, direct-reclaim stalls since the step began)."""
    moved = {name: at_stop.vmstat[name] - before.vmstat[name] for name in ("pswpout", "allocstall")}
    cold = at_stop.giveback.get("cold", {})
    return (
        f"guest when it stood still: free {mib(at_stop.mem_free_bytes)}, swap free "
        f"{mib(at_stop.swap_free_bytes)}, cold {mib(int(cold.get('bytes', 0)))}; since the "
        f"step began {moved['pswpout']} pages swapped out, {moved['allocstall']} "
        "direct-reclaim stalls"
    )


def result_text(result: GiveBack) -> str:
    step, vmm = result.step, result.vmm
    leaves = result.balloon_leaves and step.via == BALLOON

    def shown(size: int) -> str:
        """A size as the VMM speaks it: QEMU's balloon by what it leaves the guest."""
        return mib(balloon_shown(size, step.ram, leaves))

    if step.via == BALLOON:
        terms = "what it leaves the guest" if leaves else "what it takes"
        what = f"{vmm} balloon ({terms})"
    else:
        what = f"{vmm} virtio-mem {step.device} requested size"
    safe = "none reported" if step.safe is None else shown(step.safe)
    forced = " (--force: past the safe figure)" if step.forced else ""
    lines = [
        f"{what}: {shown(step.current)} -> {shown(step.value)}{forced}; safe {safe}",
        "guest before:",
        *_guest_text(result.before),
        f"{vmm} (pid {result.vmm_pid}) RSS before {_rss_text(result.rss_before)}",
    ]
    settled, after, rss_after = result.settled, result.after, result.rss_after
    if result.dry_run or settled is None or after is None or rss_after is None:
        return "\n".join([*lines, "dry run: nothing compacted, nothing asked of the VMM"])
    if settled.how == UNOBSERVED:
        how = (
            f"{step.device} asked for {shown(settled.device_bytes)}, not seen to settle: "
            f"{vmm} reports only what it asked (no balloon statistics; "
            "stats_polling_interval_s > 0 at boot shows what the guest handed over)"
        )
    else:
        short = settled.how == "stopped"
        how = (
            f"{step.device} {settled.how} at {shown(settled.device_bytes)} after "
            f"{settled.seconds} s"
            + ("; asked for that instead, so the guest is not pressed further" if short else "")
        )
    stood_still = [] if result.at_stop is None else [_stop_text(result.before, result.at_stop)]
    given = result.rss_before.guest_bytes - rss_after.guest_bytes
    lines += [
        _compact_text("compacted", result.compact or {}),
        how,
        *stood_still,
        _compact_text("compacted again", result.compact_after or {}),
        "guest after:",
        *_guest_text(after),
        f"{vmm} RSS after {_rss_text(rss_after)} ({mib(given)} given back)",
    ]
    return "\n".join(lines)
