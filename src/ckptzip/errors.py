"""The one error hierarchy of ckptzip.

Every failure a user can meet derives from :class:`Error`, and every message names the file (and the
tensor, where there is one) and says what to do about it.
"""

from __future__ import annotations


class Error(Exception):
    """Base class of every ckptzip error."""


class UnsupportedError(Error, TypeError):
    """A state holds something ckptzip cannot represent without pickle (the message names its key
    path)."""


class FormatError(Error, ValueError):
    """A file is not a valid ``.ckz`` container: wrong magic, bad header, impossible sizes."""


class VersionError(FormatError):
    """A ``.ckz`` written by a newer ckptzip than this one can read: a newer format version, or
    a codec, tree node or stream format a newer writer added within the same format version."""


class CorruptError(FormatError):
    """Stored bytes fail their checksum, or a stream does not decode: the file is damaged."""


class TruncatedError(CorruptError):
    """The file is shorter (or longer) than its header says: an interrupted copy or write."""


class KeyNotFoundError(Error, KeyError):
    """A checkpoint holds no tensor of the key asked for (``CheckpointFile.get_tensor``)."""

    def __str__(self) -> str:  # the message, not KeyError's quoted repr of it
        return str(self.args[0]) if self.args else ""


class BaseMismatchError(Error):
    """A delta checkpoint's base is missing, or is not the checkpoint it was coded against."""


class DependencyError(Error, ImportError):
    """An optional package is needed for this feature (the message says what to ``pip install``)."""


class ConfigError(Error, ValueError):
    """Invalid options: an unknown mode or codec, a bad thread count, an impossible setting."""
