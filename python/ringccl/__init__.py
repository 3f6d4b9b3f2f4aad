"""ringccl: collective communications for NVIDIA GPUs, written in Rust.

This package ships ``libnccl.so.2`` built from ringccl (NCCL 2.28's C ABI over ringccl): a
library that programs written for NCCL, PyTorch included, load in place of NCCL. It needs only
glibc and, at run time, the NVIDIA driver (``libcuda.so``, loaded when first needed).

* :func:`library_path` -- the path of the library (for ``LD_PRELOAD`` or ``ctypes``);
* :func:`load` -- load it into this process (``RTLD_GLOBAL``) and return the handle;
* :func:`version` -- ``ringcclGetVersionString()`` of the library;
* ``import ringccl.torch`` before ``import torch`` -- PyTorch binds to ringccl;
* ``ringccl-torchrun ...`` -- ``torchrun`` with the library preloaded in every worker.
"""

import ctypes
import os

__all__ = ["library_path", "load", "version", "nccl_version", "__version__"]

__version__ = "0.1.0"

_HANDLE = None


def library_path():
    """The absolute path of the ``libnccl.so.2`` this package ships."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib", "libnccl.so.2")


def load():
    """Loads the library into this process with ``RTLD_GLOBAL`` (once) and returns its handle.

    Loaded before anything else asks for ``libnccl.so.2``, it is the one the dynamic loader
    hands every later request for that name: it matches a library's ``NEEDED`` entry against
    the ``SONAME`` of what is already loaded, and this library's ``SONAME`` is ``libnccl.so.2``.
    """
    global _HANDLE
    if _HANDLE is None:
        _HANDLE = ctypes.CDLL(library_path(), mode=ctypes.RTLD_GLOBAL)
        _HANDLE.ringcclGetVersionString.restype = ctypes.c_char_p
        _HANDLE.ringcclGetVersionString.argtypes = []
        _HANDLE.ncclGetVersion.restype = ctypes.c_int
        _HANDLE.ncclGetVersion.argtypes = [ctypes.POINTER(ctypes.c_int)]
    return _HANDLE


def version():
    """``ringcclGetVersionString()``: what the library is (ringccl's version and NCCL's API)."""
    return load().ringcclGetVersionString().decode()


def nccl_version():
    """``ncclGetVersion()``: the NCCL version code the library implements (e.g. 22809)."""
    v = ctypes.c_int(0)
    rc = load().ncclGetVersion(ctypes.byref(v))
    if rc != 0:
        raise RuntimeError("ncclGetVersion failed with ncclResult_t %d" % rc)
    return v.value
