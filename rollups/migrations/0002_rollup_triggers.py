"""PostgreSQL triggers that list a materialised bucket dirty when its raw rows change.

See ``rollups.refresh`` for the ordering rules (advisory lock shared by writers, exclusive
for the watermark move; ``ON CONFLICT DO UPDATE`` so the refresh's DELETE waits for the
writer). A change is marked for the OLD and the NEW times of the row, so a row moved
across a bucket boundary dirties both buckets. Other engines get no triggers (and no
rollup reads). The triggers fire on COPY too (the history seeder).
"""

from __future__ import annotations

from django.db import migrations

LOCK_KEY = 7_160_171  # rollups.refresh.LOCK_KEY (a migration must not import app code)

MARK = f"""
CREATE OR REPLACE FUNCTION rollups_mark(t timestamptz) RETURNS void AS $$
DECLARE
    b bigint;
    w bigint;
BEGIN
    IF t IS NULL THEN
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock_shared({LOCK_KEY});
    SELECT watermark INTO w FROM rollups_rollupstate WHERE id = 1;
    b := CAST(FLOOR(CAST(EXTRACT(EPOCH FROM t) * 1000 AS DOUBLE PRECISION) / 1800000.0) AS BIGINT);
    IF w IS NULL OR b >= w THEN
        RETURN;
    END IF;
    INSERT INTO rollups_rollupdirty (bucket, marks) VALUES (b, 1)
        ON CONFLICT (bucket) DO UPDATE SET marks = rollups_rollupdirty.marks + 1;
END
$$ LANGUAGE plpgsql;

CREATE OR REPLACE FUNCTION rollups_sandbox_changed() RETURNS trigger AS $$
BEGIN
    IF TG_OP <> 'INSERT' THEN
        PERFORM rollups_mark(OLD.requested_at);
        PERFORM rollups_mark(OLD.ready_at);
        PERFORM rollups_mark(OLD.scheduled_at);
    END IF;
    IF TG_OP <> 'DELETE' THEN
        PERFORM rollups_mark(NEW.requested_at);
        PERFORM rollups_mark(NEW.ready_at);
        PERFORM rollups_mark(NEW.scheduled_at);
    END IF;
    RETURN NULL;
END
$$ LANGUAGE plpgsql;

CREATE OR REPLACE FUNCTION rollups_acquisition_changed() RETURNS trigger AS $$
BEGIN
    IF TG_OP <> 'INSERT' THEN
        PERFORM rollups_mark(OLD.finished_at);
    END IF;
    IF TG_OP <> 'DELETE' THEN
        PERFORM rollups_mark(NEW.finished_at);
    END IF;
    RETURN NULL;
END
$$ LANGUAGE plpgsql;
"""

_SANDBOX_COLUMNS = (
    "job_id", "backend", "requested_at", "ready_at", "scheduled_at", "address_failures",
    "image_present", "node",
)
_ACQUISITION_COLUMNS = (
    "job_id", "sandbox_id", "finished_at", "outcome", "source", "key_hash", "wait_ms", "queue_ms",
)


def _triggers(table: str, function: str, columns: tuple[str, ...]) -> str:
    old = ", ".join(f"OLD.{c}" for c in columns)
    new = ", ".join(f"NEW.{c}" for c in columns)
    return f"""
CREATE TRIGGER {table}_rollups_rows AFTER INSERT OR DELETE ON {table}
    FOR EACH ROW EXECUTE FUNCTION {function}();
CREATE TRIGGER {table}_rollups_update AFTER UPDATE OF {", ".join(columns)} ON {table}
    FOR EACH ROW WHEN (ROW({old}) IS DISTINCT FROM ROW({new}))
    EXECUTE FUNCTION {function}();
"""


CREATE = (
    MARK
    + _triggers("sandboxes_sandbox", "rollups_sandbox_changed", _SANDBOX_COLUMNS)
    + _triggers("sandboxes_acquisition", "rollups_acquisition_changed", _ACQUISITION_COLUMNS)
)
DROP = """
DROP TRIGGER IF EXISTS sandboxes_sandbox_rollups_rows ON sandboxes_sandbox;
DROP TRIGGER IF EXISTS sandboxes_sandbox_rollups_update ON sandboxes_sandbox;
DROP TRIGGER IF EXISTS sandboxes_acquisition_rollups_rows ON sandboxes_acquisition;
DROP TRIGGER IF EXISTS sandboxes_acquisition_rollups_update ON sandboxes_acquisition;
DROP FUNCTION IF EXISTS rollups_sandbox_changed();
DROP FUNCTION IF EXISTS rollups_acquisition_changed();
DROP FUNCTION IF EXISTS rollups_mark(timestamptz);
"""


def _create(apps: object, schema_editor: object) -> None:
    if schema_editor.connection.vendor == "postgresql":  # type: ignore[attr-defined]
        schema_editor.execute(CREATE)  # type: ignore[attr-defined]


def _drop(apps: object, schema_editor: object) -> None:
    if schema_editor.connection.vendor == "postgresql":  # type: ignore[attr-defined]
        schema_editor.execute(DROP)  # type: ignore[attr-defined]


class Migration(migrations.Migration):
    dependencies = [
        ("rollups", "0001_rollup_tables"),
        ("sandboxes", "0010_rollup_step_attribution"),
    ]

    operations = [migrations.RunPython(_create, _drop)]
