from slugs import slugify


def test_two_words():
    assert slugify("Hello World") == "hello-world"


def test_repeated_and_outer_spaces():
    assert slugify("  Hello   World ") == "hello-world"
