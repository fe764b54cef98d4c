"""Browser tests of the operator pages: Daphne in-process and Debian's Chromium."""
