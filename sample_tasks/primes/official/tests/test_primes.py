import time

from primes import is_prime


def test_small_primes():
    assert [n for n in range(2, 12) if is_prime(n)] == [2, 3, 5, 7, 11]


def test_exhaustive_table():
    # Stands for a suite far longer than the task's time limit.
    time.sleep(60)
    assert is_prime(7919)


def test_one_is_not_prime():
    assert not is_prime(1)
