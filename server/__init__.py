"""HTTP side of slotserve: the FastAPI app, its routes and middleware, the console script."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("slotserve")
except PackageNotFoundError:  # run from a source tree that was not installed
    __version__ = "0+source"
