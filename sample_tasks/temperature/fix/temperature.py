"""Temperature conversions."""


def c_to_f(celsius: float) -> float:
    return celsius * 9 / 5 + 32
