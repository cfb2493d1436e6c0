"""Errors a user can act on. Raised where the fact is known, shown once by the CLI (no traceback)."""


class OpenJetError(Exception):
    """Base class: the message is complete and meant for the user."""


class ModelFileError(OpenJetError):
    """A model file that cannot be read, or that does not describe a model we can run."""
