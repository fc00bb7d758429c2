"""The package's version, in one place: a leaf module every layer may import (the package face
`pytest_satbench/__init__.py` re-exports it; pyproject.toml reads it for the build)."""

__version__ = "0.1.0"
