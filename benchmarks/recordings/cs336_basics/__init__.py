import importlib.metadata

try:
    __version__ = importlib.metadata.version("cs336-basics")
except importlib.metadata.PackageNotFoundError:
    pass
