"""dcp's version: the one place it is written (``pyproject.toml`` reads it from here)."""

__version__ = "0.1.0.dev0"

#: The name dcp is published under on PyPI (``dcp`` itself is another project's; the import
#: name and the command are ``dcp``).
DISTRIBUTION = "dagbox-dcp"
