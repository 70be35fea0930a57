"""Settings of the Django example: one app (``shop``), the database from
``CYCLONE_DATABASE_URL``.

    cyclone migrate --dsn postgresql://...
    CYCLONE_DATABASE_URL=postgresql://... DJANGO_SETTINGS_MODULE=examples.django_app.settings \\
        django-admin migrate && ... django-admin runserver
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit

_url = urlsplit(os.environ.get("CYCLONE_DATABASE_URL", "postgresql://localhost/cyclone"))

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-only-not-secret")
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]
INSTALLED_APPS = ["examples.django_app.shop"]
ROOT_URLCONF = "examples.django_app.urls"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",  # psycopg 3 when installed
        "NAME": _url.path.lstrip("/"),
        "USER": _url.username or "",
        "PASSWORD": _url.password or "",
        "HOST": _url.hostname or "",
        "PORT": str(_url.port or ""),
    }
}
