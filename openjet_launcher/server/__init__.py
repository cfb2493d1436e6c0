"""The HTTP server: OpenAI-compatible API over one engine worker (see app.py, worker.py)."""

from .app import create_app
from .settings import ServerSettings

__all__ = ["create_app", "ServerSettings"]
