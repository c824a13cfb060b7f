"""Test and benchmark harnesses: hosts as network namespaces."""
