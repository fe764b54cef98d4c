"""``python manage.py create_trainer_token USERNAME``: print a DRF token for a trainer.

Creates the user (with an unusable password: trainers authenticate with the token only)
if it does not exist, and reuses the user's existing token, so running it twice prints
the same key. The token is the only thing written to stdout, for scripts.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import models, transaction
from rest_framework.authtoken.models import Token


class Command(BaseCommand):
    help = "Print a DRF API token for USERNAME, creating the user if needed."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument(
            "--rotate", action="store_true", help="replace the user's token with a new one"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        username = options["username"].strip()
        User = get_user_model()
        field = User._meta.get_field(User.USERNAME_FIELD)
        assert isinstance(field, models.Field)
        if not username:
            raise CommandError("the username must not be empty")
        try:
            field.run_validators(username)
        except ValidationError as exc:
            raise CommandError(f"{username!r} is not a valid username: {exc.messages}") from exc
        with transaction.atomic():
            user, created = User.objects.get_or_create(**{User.USERNAME_FIELD: username})
            if created:
                user.set_unusable_password()
                user.save(update_fields=["password"])
            if options["rotate"]:
                Token.objects.filter(user=user).delete()
            token, _ = Token.objects.get_or_create(user=user)
        if created:
            self.stderr.write(f"created user {username}")
        self.stdout.write(token.key)
