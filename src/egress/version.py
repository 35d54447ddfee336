"""The version of egress (``egress --version``, ``/status``)."""

__version__ = "0.1.0"
