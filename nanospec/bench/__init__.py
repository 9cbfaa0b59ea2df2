"""Offline job: benchmarks (method comparison, tree sweeps, forward cost, random pairs at real shapes)."""
