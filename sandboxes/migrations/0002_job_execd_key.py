"""Every job gets its own execd key (issue 9 item 2): existing jobs a random one each."""

import secrets

from django.db import migrations, models

import sandboxes.models


def give_each_job_a_key(apps, schema_editor):
    Job = apps.get_model("sandboxes", "Job")
    for job in Job.objects.filter(execd_key="").only("pk").iterator():
        Job.objects.filter(pk=job.pk).update(execd_key=secrets.token_hex(32))


class Migration(migrations.Migration):
    dependencies = [("sandboxes", "0001_initial")]

    operations = [
        # Added empty first: a callable default is evaluated ONCE for existing rows, which
        # would give every existing job the same key.
        migrations.AddField(
            model_name="job",
            name="execd_key",
            field=models.CharField(default="", editable=False, max_length=64),
            preserve_default=False,
        ),
        migrations.RunPython(give_each_job_a_key, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="job",
            name="execd_key",
            field=models.CharField(
                default=sandboxes.models.new_execd_key, editable=False, max_length=64
            ),
        ),
    ]
