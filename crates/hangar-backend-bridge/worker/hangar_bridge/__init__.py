"""Hangar's bridge worker: runs one engine for one model replica (see PROTOCOL.md).

Only the standard library is imported here; engine packages are imported by an adapter's
`load`. This module holds what every adapter shares: the error type and package checks.
"""

import importlib.util
import os
import sys

__version__ = "0.1.0"

# Engine name -> adapter module (hangar_bridge.<module>).
ENGINES = {"ct2": "ct2", "exllamav3": "exllamav3", "vllm": "vllm"}


class BridgeError(Exception):
    """A request's failure, sent as `{"type": "error", "code": ..., "message": ...}`."""

    def __init__(self, code, message, **extra):
        super().__init__(message)
        self.code = code
        self.message = message
        self.extra = extra

    def reply(self):
        return {"type": "error", "code": self.code, "message": self.message, **self.extra}


def log(message):
    """One human line on stderr: the model's log in Hangar."""
    print(f"hangar_bridge: {message}", file=sys.stderr, flush=True)


def missing_package(package, why=""):
    """The `missing_package` error for `package` under this interpreter."""
    reason = f" ({why})" if why else ""
    return BridgeError(
        "missing_package",
        f"the Python package '{package}' is not importable by {sys.executable}{reason}; "
        f"install it with: {sys.executable} -m pip install {package}",
        package=package,
        python=sys.executable,
    )


def find_missing(packages):
    """The first of `packages` that importlib cannot find (without importing it), or None."""
    for package in packages:
        try:
            if importlib.util.find_spec(package) is None:
                return package
        except (ImportError, ValueError):
            return package
    return None


def require(packages, why=""):
    """Raises `missing_package` for the first of `packages` that is not findable."""
    package = find_missing(packages)
    if package is not None:
        raise missing_package(package, why)


def import_failed(engine, error):
    """The error for an engine package whose import raised ImportError: `missing_package`
    when a dependency is absent, else `load_failed`."""
    name = (getattr(error, "name", None) or "").split(".")[0]
    if name and name != engine and find_missing([name]) is not None:
        return missing_package(name, f"{engine} imports it")
    return BridgeError("load_failed", f"{engine} failed to import: {error}")


def model_dir(model):
    """The load's `model_path`, which must exist (`not_found` otherwise)."""
    path = model.get("model_path")
    if not path:
        raise BridgeError("not_found", f"model '{model.get('name')}' has no model_path")
    if not os.path.exists(path):
        raise BridgeError("not_found", f"model_path `{path}` does not exist")
    return path


def free_torch_memory():
    """gc, then torch.cuda.empty_cache() when torch is installed (imported only then)."""
    import gc

    gc.collect()
    if find_missing(["torch"]) is None:
        try:
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        except Exception as e:  # noqa: BLE001 - freeing memory is best effort
            log(f"torch.cuda.empty_cache failed: {e}")
