"""Clamp a number into a closed interval."""


def clamp(x: float, lo: float, hi: float) -> float:
    return max(lo, min(x, hi))
