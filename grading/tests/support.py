"""Helpers for the grading tests: a SWE-bench instance as the datasets ship it, row counts."""

from __future__ import annotations

import json
from typing import Any

from grading.models import Task, TaskSet

FIX = """diff --git a/calc.py b/calc.py
--- a/calc.py
+++ b/calc.py
@@ -1,2 +1,2 @@
 def add(a, b):
-    return a - b
+    return a + b
"""
TEST_PATCH = """diff --git a/tests/test_calc.py b/tests/test_calc.py
--- a/tests/test_calc.py
+++ b/tests/test_calc.py
@@ -1,3 +1,6 @@
 from calc import add
 def test_add_zero():
     assert add(1, 0) == 1
+
+def test_add():
+    assert add(2, 2) == 4
"""


def instance(**over: Any) -> dict[str, Any]:
    """A SWE-bench instance; FAIL_TO_PASS / PASS_TO_PASS JSON-encoded, as SWE-bench ships them."""
    body: dict[str, Any] = {
        "instance_id": "sandman__calc-1",
        "repo": "sandman/calc",
        "base_commit": "0123456789abcdef0123456789abcdef01234567",
        "patch": FIX,
        "test_patch": TEST_PATCH,
        "FAIL_TO_PASS": json.dumps(["tests/test_calc.py::test_add"]),
        "PASS_TO_PASS": json.dumps(["tests/test_calc.py::test_add_zero"]),
        "version": "1.0",
        "environment_setup_commit": "0123456789abcdef0123456789abcdef01234567",
        "problem_statement": "add() subtracts",
        "hints_text": "",
        "created_at": "2024-01-01T00:00:00Z",
        "image": "sandman/calc",
    }
    body.update(over)
    return body


def grading_counts() -> dict[str, int]:
    """Every grading table a request could write: asserted unchanged after a rejection."""
    return {
        "tasks": Task.objects.count(),
        "task_sets": TaskSet.objects.count(),
        "memberships": TaskSet.tasks.through.objects.count(),
    }
