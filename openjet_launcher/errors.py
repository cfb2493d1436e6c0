"""Errors a user can act on. Raised where the fact is known, shown once by the CLI (no traceback)."""


class OpenJetError(Exception):
    """Base class: the message is complete and meant for the user."""


class ModelFileError(OpenJetError):
    """A model file that cannot be read, or that does not describe a model we can run."""


# `serve`'s exit status when the model failed to load: the supervisor gives up at once (a restart would fail the
# same way) instead of restarting or waiting for /health.
EXIT_LOAD_FAILED = 4


class ModelLoadError(OpenJetError):
    """The engine could not load the model; `serve` exits with EXIT_LOAD_FAILED."""

    exit_code = EXIT_LOAD_FAILED
