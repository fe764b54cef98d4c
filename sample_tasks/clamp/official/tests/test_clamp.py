from clamp import clamp


def test_inside():
    assert clamp(5, 0, 10) == 5


def test_below_the_interval():
    # Meant to check the lower bound; it checks the upper one (the planted defect).
    assert clamp(15, 0, 10) == 10
