"""execd: the small HTTP daemon that runs inside every Sandman sandbox.

It keeps one persistent bash per sandbox and exposes it, the sandbox's files,
its run conditions and a state check over HTTP/1.1 (see docs/architecture.md §6).

Invariant: every module in this package imports only the Python standard
library and parses on Python 3.8 (``ast.parse(src, feature_version=(3, 8))``);
the image's own ``python3`` runs it, so no third-party package may appear here.
"""

__version__ = "0.1.0"
