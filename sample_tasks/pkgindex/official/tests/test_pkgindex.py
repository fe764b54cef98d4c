from pkgindex import latest_version, version_key


def test_version_key_orders_numerically():
    assert version_key("1.10") > version_key("1.9")


def test_latest_version_from_the_index():
    # The index serves {"versions": ["1.2", "1.10", "1.9"]} for "demo".
    assert latest_version("demo") == "1.10"
