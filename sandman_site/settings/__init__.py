"""Layered settings: base, then dev / test / production on top."""
