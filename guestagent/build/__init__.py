"""Host-side build of what ships to a guest: the agent's self-contained runtime tree, the
check that every ELF file in it loads only from it, and the Kata guest extension image.
Never imported by the guest side (the import contracts in tests/unit/test_layout.py)."""
