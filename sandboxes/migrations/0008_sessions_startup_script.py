from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("sandboxes", "0007_agents_renew_idempotency"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="startup_script",
            field=models.TextField(blank=True, default=""),
        ),
    ]
