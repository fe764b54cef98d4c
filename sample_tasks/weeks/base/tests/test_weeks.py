from weeks import day_of

SUNDAY_EVENING_UTC = 1699819200  # 2023-11-12 20:00 UTC; already Monday in Tokyo


def test_day_of():
    assert day_of(SUNDAY_EVENING_UTC) == "2023-11-12"
