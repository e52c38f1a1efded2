"""`guestctl node`: one daemon per host that finds every sandbox VM the runtimes started and
drives each guest's agent. `sandboxes.py` says what a sandbox is and where each runtime
leaves one (pure); `discovery.py` finds them on disk and `shim.py` asks a Kata shim for its
guest's address; `config.py` reads the node's policy; `pressure.py` weighs the host's own
memory and decides each guest's headroom (pure); `guest.py` is one VM's loop (its state
machine pure); `cri.py` names pods; `metrics.py` is the node's Prometheus endpoint;
`daemon.py` runs it all (docs/node.md)."""
