from pkgindex import version_key


def test_version_key_orders_numerically():
    assert version_key("1.10") > version_key("1.9")
