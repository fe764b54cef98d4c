from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("grading", "0004_cert_certification"),
    ]

    operations = [
        migrations.AddField(
            model_name="grading",
            name="shadow_requested",
            field=models.BooleanField(default=False),
        ),
        migrations.AddField(
            model_name="grading",
            name="shadow",
            field=models.JSONField(blank=True, default=dict),
        ),
        migrations.AddField(
            model_name="grading",
            name="shadow_agrees",
            field=models.BooleanField(blank=True, null=True),
        ),
    ]
