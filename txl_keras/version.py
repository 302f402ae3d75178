"""The package's version, read by setup.py and written into saved presets."""

__version__ = "0.1.0"
