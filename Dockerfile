# The Sandman service image (k8s/sandman.yaml). Not built in CI: no Docker engine there.
FROM python:3.11-slim-bookworm
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    DJANGO_SETTINGS_MODULE=sandman_site.settings.production
RUN apt-get update \
    && apt-get install -y --no-install-recommends git bubblewrap slirp4netns \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml README.md manage.py ./
COPY sandman_site sandman_site
COPY sandboxes sandboxes
COPY grading grading
COPY incidents incidents
COPY dashboards dashboards
COPY execd execd
COPY templates templates
COPY static static
# uvicorn: the web workers of split processes (k8s/sandman.yaml's container `web`).
RUN pip install --no-cache-dir '.[uvicorn,fast]' \
    && SANDMAN_SECRET_KEY=build DATABASE_URL=postgres://build@localhost/build \
       python manage.py collectstatic --noinput
USER 65532:65532
EXPOSE 8000
CMD ["daphne", "-b", "0.0.0.0", "-p", "8000", "sandman_site.asgi:application"]
