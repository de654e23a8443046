"""The import path of :mod:`depsi.geometry` before it was a package of its own: the same names,
for the code and notebooks that import them from here."""

from depsi.geometry import *  # noqa: F403
from depsi.geometry import __all__  # noqa: F401
