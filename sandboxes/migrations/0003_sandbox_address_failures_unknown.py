"""Sandbox.address_failures may be NULL: unknown when no core/v1 Event told (not 0)."""

from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("sandboxes", "0002_job_execd_key")]

    operations = [
        migrations.AlterField(
            model_name="sandbox",
            name="address_failures",
            field=models.PositiveIntegerField(blank=True, default=0, null=True),
        ),
    ]
