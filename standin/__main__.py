"""``python -m standin``: serve a stand-in cluster until SIGINT/SIGTERM (see ``standin.cli``).

Nothing but the call of :func:`standin.cli.main` belongs here.
"""

from __future__ import annotations

from standin.cli import main

if __name__ == "__main__":
    main()
