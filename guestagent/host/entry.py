"""guestctl's entry: ssl kept out (tls.py says why) and protobuf's unused halves deferred
(load_on_use.py) before any other import, then the command line."""

from __future__ import annotations

from guestagent.host.tls import keep_ssl_out
from guestagent.load_on_use import PROTOBUF_PURE_PYTHON, PROTOBUF_TIMESTAMPS, load_on_use

# Not ipaddress, which the agent defers: the node's loops are threads, and Python 3.11's
# LazyLoader is not safe against two threads' first reads (load_on_use.py).
DEFERRED = (*PROTOBUF_PURE_PYTHON, *PROTOBUF_TIMESTAMPS)


def entry() -> int:
    keep_ssl_out()
    load_on_use(DEFERRED)
    from guestagent.host.ctl import main

    return main()
