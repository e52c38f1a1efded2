"""guestagent: the in-guest memory agent of a VM-based container runtime."""

__version__ = "0.1.0"
