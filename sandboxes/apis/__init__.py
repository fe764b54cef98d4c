"""The REST API for trainers (docs/architecture.md §5): one APIView per operation.

``jobs`` holds job create/list/get and the pool operations (acquire, prewarm, drain);
``sandboxes`` holds sandbox list/detail/release. Names of paths and fields are a
contract with trainers: add, never rename.

The hot routes (acquire, release) are async views (``asyncview``) that ask ``access``
(who is this token, whose job is this) instead of the database, and ``fastpath`` answers
them for known callers without Django's handler (wired in ``sandman_site.asgi``).
"""
