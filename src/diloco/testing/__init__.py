"""Harnesses for tests and benchmarks (no torch needed): emulated hosts (:mod:`diloco.testing.hosts`)."""
