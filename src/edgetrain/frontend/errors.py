"""The frontend's errors, apart so that the converter modules and capture raise the same
classes without importing each other (edgetrain.CaptureError, edgetrain.UnsupportedOpError)."""


class CaptureError(ValueError):
    """The model could not be captured or translated."""


class UnsupportedOpError(CaptureError):
    """The model uses an op (or a form of one) the IR cannot express; the message names it and
    capture adds the model's source line."""
