"""Byte units, defined once for every layer: the agent, the host's tools and the build."""

MIB = 1 << 20
GIB = 1 << 30
