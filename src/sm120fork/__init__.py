"""Fork-maintenance toolkit: pinned SGLang + FlashInfer releases -> SM120/SM121 wheels."""

__version__ = "0.1.0"
