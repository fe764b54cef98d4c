from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("sandboxes", "0004_trajectories"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="reuse_allow_tags",
            field=models.BooleanField(default=False),
        ),
    ]
