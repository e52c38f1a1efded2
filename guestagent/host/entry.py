"""guestctl's entry: ssl kept out (tls.py says why) before any other import, then the command
line."""

from __future__ import annotations

from guestagent.host.tls import keep_ssl_out


def entry() -> int:
    keep_ssl_out()
    from guestagent.host.ctl import main

    return main()
