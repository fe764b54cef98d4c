"""``python manage.py import_tasks FILE.jsonl``: all or nothing, bad lines named by number."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from grading.models import Task, TaskSet
from grading.tests.support import grading_counts, instance

pytestmark = pytest.mark.django_db


def _write(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_a_file_of_instances_is_imported_into_a_task_set(tmp_path):
    lines = [
        json.dumps(instance(instance_id="calc-1")),
        "",
        json.dumps(instance(instance_id="calc-2", FAIL_TO_PASS=["tests/test_calc.py::test_add"])),
    ]
    out = io.StringIO()
    call_command("import_tasks", str(_write(tmp_path, lines)), "--task-set", "sample", stdout=out)
    assert "imported 2 tasks" in out.getvalue()
    assert sorted(Task.objects.values_list("instance_id", flat=True)) == ["calc-1", "calc-2"]
    assert Task.objects.get(instance_id="calc-2").fail_to_pass == ["tests/test_calc.py::test_add"]
    group = TaskSet.objects.get(name="sample")
    assert sorted(t.instance_id for t in group.tasks.all()) == ["calc-1", "calc-2"]


@pytest.mark.parametrize(
    "bad_line, words",
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "JSON object"),
        (json.dumps(instance(instance_id="calc-3", FAIL_TO_PASS="test_add")), "FAIL_TO_PASS"),
        (json.dumps(instance(instance_id="calc-3", patch="no diff here")), "patch"),
    ],
)
def test_a_malformed_line_is_reported_with_its_number_and_nothing_is_stored(
    tmp_path, bad_line, words
):
    lines = [json.dumps(instance(instance_id="calc-1")), json.dumps(instance(instance_id="calc-2"))]
    lines.insert(2, bad_line)  # line 3
    before = grading_counts()
    with pytest.raises(CommandError) as caught:
        call_command("import_tasks", str(_write(tmp_path, lines)), "--task-set", "sample")
    assert str(caught.value).startswith("line 3:")
    assert words in str(caught.value)
    assert grading_counts() == before


def test_an_instance_id_twice_in_one_file_or_already_stored_imports_nothing(tmp_path):
    twice = [json.dumps(instance(instance_id="calc-1")), json.dumps(instance(instance_id="calc-1"))]
    with pytest.raises(CommandError, match="appears twice"):
        call_command("import_tasks", str(_write(tmp_path, twice)))
    assert grading_counts()["tasks"] == 0
    call_command("import_tasks", str(_write(tmp_path, twice[:1])), stdout=io.StringIO())
    again = [json.dumps(instance(instance_id="calc-2")), twice[0]]
    with pytest.raises(CommandError, match="already stored"):
        call_command("import_tasks", str(_write(tmp_path, again)), "--task-set", "s")
    assert list(Task.objects.values_list("instance_id", flat=True)) == ["calc-1"]
    assert not TaskSet.objects.exists()


def test_an_unreadable_or_empty_file_is_an_error(tmp_path):
    with pytest.raises(CommandError, match="cannot read"):
        call_command("import_tasks", str(tmp_path / "missing.jsonl"))
    with pytest.raises(CommandError, match="no tasks"):
        call_command("import_tasks", str(_write(tmp_path, ["", "  "])))
