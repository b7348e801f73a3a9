"""Batch evaluation: built-in suites, reference policies, metrics, the runner and its report."""
