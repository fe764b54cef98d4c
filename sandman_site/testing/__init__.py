"""Helpers the test suites of several apps share (imported by tests only)."""
