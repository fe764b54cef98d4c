"""Primality by trial division."""


def is_prime(n: int) -> bool:
    return all(n % d for d in range(2, int(n**0.5) + 1))
