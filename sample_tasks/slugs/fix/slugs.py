"""Slugs for titles: lower-case words joined by '-'."""


def slugify(title: str) -> str:
    words = title.lower().split()
    return "-".join(words)
