"""The working-set reclaimer: policy.py decides, writer.py writes memory.reclaim, compaction.py
compacts after, reclaimer.py runs the loop over every target cgroup."""
