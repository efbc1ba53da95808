"""The errors a user can fix: every command prints them as one `error:` line.

    UsageError                 base: bad input, nothing to debug
    +-- ConfigError            a setting or flag that is unknown, missing or out of range
    +-- DataError              a corpus, text file or vocabulary that cannot be used
    +-- CheckpointError        a `.keras` checkpoint that cannot be loaded or averaged
    +-- ExportError            an export folder or SavedModel version that is taken or missing

All derive from `ValueError`, so callers that caught `ValueError` still do.
"""


class UsageError(ValueError):
    """Input the user can correct; commands exit with status 2 and one line."""


class ConfigError(UsageError):
    """A configuration or flag that names something unknown, inconsistent or out of range."""


class DataError(UsageError):
    """A data file, corpus or tokenizer input that is missing or malformed."""


class CheckpointError(UsageError):
    """A checkpoint that is missing, unreadable or of another architecture."""


class ExportError(UsageError):
    """A SavedModel or CTranslate2 folder that already exists or is not there."""
