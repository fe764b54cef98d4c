from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("sandboxes", "0008_place_node_pool_and_addresses"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="startup_script",
            field=models.TextField(blank=True, default=""),
        ),
    ]
