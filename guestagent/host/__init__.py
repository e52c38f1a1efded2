"""The host's tools: everything that runs beside the VMs, never in a guest.

At this level, what every wing shares: the agent's client (`client.py`, a refusal's reason in
`refusal.py`, a stream reopened when it breaks in `streams.py`), sizes (`units.py`) and the
answers as text (`display.py`). The wings, one job each: `vmm/` (the VMMs' APIs), `giveback/`
(give-back and --follow), `metrics/` (Prometheus), `sizing/` (plan and measure-overhead), and
`commands/` with `ctl.py`, guestctl itself, on top of them all.
"""
