"""A cgroup, all of it: name.py its name, checked once where it comes in; tree.py finding,
making and unmaking it below the cgroup2 mount; procs.py the processes in it (this one's
own cgroup, and moving it); memory.py its memory controller, a handle with typed reads and
writes of the memory.* files; process_memory.py the memory cgroup of any process and its use
against its limit, cgroup v1 too (what the host reads of a VMM). ops/ and agent/ reach a
cgroup through their Kernel (linux/kernel.py: kernel.cgroup(name))."""
