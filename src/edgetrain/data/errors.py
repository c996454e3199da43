"""The error every data loader raises for a missing or malformed data set."""


class DataError(RuntimeError):
    """A data set is missing or malformed."""
