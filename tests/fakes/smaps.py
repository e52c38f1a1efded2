"""A VMM's /proc/PID/smaps, for the host's readers of it (host/vmm_memory.py, measure)."""

SMAPS = """\
5624d164d000-5624d1a54000 r--p 00000000 fe:00 2170918                    /usr/bin/qemu-system-x86_64
Size:               4124 kB
Rss:                4100 kB
VmFlags: rd mr mw me sd
7fa3c4c00000-7fa3d7e00000 rw-p 00000000 00:00 0
Size:             313344 kB
Rss:              170000 kB
Pss:              170000 kB
7fa3e4000000-7fa424000000 rwxp 00000000 00:00 0
Size:            1048576 kB
Rss:              288000 kB
7fa500000000-7fa513200000 rw-p 00000000 00:00 0 [heap]
Size:             313344 kB
Rss:                1000 kB
"""
