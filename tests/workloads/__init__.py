"""Workloads shared by the VM tests and the benchmarks."""
