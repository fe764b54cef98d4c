from weeks import day_of, week_start

SUNDAY_EVENING_UTC = 1699819200  # 2023-11-12 20:00 UTC; already Monday in Tokyo


def test_day_of():
    assert day_of(SUNDAY_EVENING_UTC) == "2023-11-12"


def test_week_start_on_a_sunday_evening():
    assert week_start(SUNDAY_EVENING_UTC) == "2023-11-06"
