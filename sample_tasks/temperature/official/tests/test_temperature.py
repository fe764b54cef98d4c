from temperature import c_to_f


def test_returns_a_float():
    assert isinstance(c_to_f(1.0), float)


def test_boiling_point():
    assert c_to_f(100) == 212
