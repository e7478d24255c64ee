"""Benchmarks (not tests): run them by hand; they print figures and ratios."""
