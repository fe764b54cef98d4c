"""Calendar weeks of Unix timestamps, in the local time zone."""

import datetime as dt


def day_of(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts).date().isoformat()


def week_start(ts: float) -> str:
    """The Monday that starts the (local) week of ``ts``."""
    day = dt.datetime.fromtimestamp(ts).date()
    return (day - dt.timedelta(days=day.isoweekday())).isoformat()
