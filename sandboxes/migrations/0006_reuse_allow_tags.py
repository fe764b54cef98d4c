from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("sandboxes", "0005_obs_dashboard_indexes"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="reuse_allow_tags",
            field=models.BooleanField(default=False),
        ),
    ]
