"""Make PyTorch use ringccl: ``import ringccl.torch`` before ``import torch``.

Importing this module loads ringccl's ``libnccl.so.2`` with ``RTLD_GLOBAL``. A CUDA build of
PyTorch from PyPI links ``libtorch_cuda.so`` against ``libnccl.so.2`` (``NEEDED``) and finds it
through its ``RPATH`` in the ``nvidia-nccl-cu1x`` wheel (``nvidia/nccl/lib``); when that fails,
``torch/__init__.py`` (``_load_global_deps`` / ``_preload_cuda_deps``) loads the wheel's
``libnccl.so.*`` by path itself. Neither loads a second NCCL once ringccl's library is
loaded: the dynamic loader satisfies a ``NEEDED`` entry with an already loaded library of that
``SONAME`` before searching any path, and this module points every ``ctypes`` open of a file
named ``libnccl.so*`` other than ringccl's at ringccl's library (an open by path would otherwise
map the wheel's copy beside it). What must hold:

* this module is imported before ``torch`` (importing it afterwards raises ``RuntimeError``,
  because NCCL is then already bound);
* no ``LD_PRELOAD`` names another ``libnccl.so.2``.

:func:`check` verifies it in the running process. In workers started by ``torchrun``, import
this module in the training script before torch, or start the job with ``ringccl-torchrun``
(which sets ``LD_PRELOAD`` for every worker).
"""

import ctypes
import os
import sys

import ringccl

__all__ = ["check"]

if "torch" in sys.modules and os.environ.get("RINGCCL_TORCH_LATE_OK") != "1":
    raise RuntimeError(
        "import ringccl.torch before torch: torch is already imported, so its NCCL is "
        "already bound (or run the job with ringccl-torchrun, which preloads the library)"
    )

_LIB = ringccl.load()
_OURS = os.path.realpath(ringccl.library_path())
_CDLL_INIT = ctypes.CDLL.__init__


def _redirected(name):
    """``name`` unless it is another NCCL library's file, then ringccl's library."""
    try:
        path = os.fsdecode(name)
    except TypeError:
        return name
    if not os.path.basename(path).startswith("libnccl.so"):
        return name
    if os.path.realpath(path) == _OURS:
        return name
    return _OURS


def _cdll_init(self, name, *args, **kwargs):
    if name is not None:
        name = _redirected(name)
    _CDLL_INIT(self, name, *args, **kwargs)


# torch's own loader (``torch/__init__.py``) opens the CUDA wheels' libraries by path with
# ctypes, the ``nvidia-nccl`` wheel's ``libnccl.so.2`` among them; a library opened by path is
# loaded anew even when one of its SONAME is loaded already. Such an open is pointed at
# ringccl's library instead (already loaded: the same handle), so that one NCCL is mapped.
ctypes.CDLL.__init__ = _cdll_init


def _mapped_ncclish():
    """The files of this process's mappings whose name looks like an NCCL library."""
    seen = set()
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                parts = line.split(None, 5)
                if len(parts) == 6:
                    path = parts[5].strip()
                    base = os.path.basename(path)
                    if base.startswith("libnccl") and ".so" in base:
                        seen.add(os.path.realpath(path))
    except OSError:
        pass
    return sorted(seen)


def check():
    """Confirms that this process runs ringccl as its NCCL and returns a short report.

    Checks that ``ringcclGetVersionString`` and ``ncclGetVersion`` resolve in the process's
    global symbol scope to ringccl's library, that no other NCCL library is mapped, and, when
    ``torch`` is imported and built with NCCL, that ``torch.cuda.nccl.version()`` (torch's own
    binding of ``ncclGetVersion``) gives ringccl's version. Raises ``RuntimeError`` otherwise.
    """
    ours = os.path.realpath(ringccl.library_path())
    glob = ctypes.CDLL(None)
    try:
        fn = glob.ringcclGetVersionString
    except AttributeError:
        raise RuntimeError("ringcclGetVersionString is not in this process's global scope")
    fn.restype = ctypes.c_char_p
    fn.argtypes = []
    version_string = fn().decode()
    code = ringccl.nccl_version()
    others = [p for p in _mapped_ncclish() if p != ours]
    if others:
        raise RuntimeError(
            "another NCCL library is loaded next to ringccl's: %s (import ringccl.torch "
            "before torch, and set no LD_PRELOAD of another libnccl)" % ", ".join(others)
        )
    report = {"ringccl": version_string, "nccl_version": code, "library": ours}
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            tv = torch.cuda.nccl.version()
        except Exception as e:  # torch without CUDA/NCCL
            report["torch_nccl"] = "unavailable: %s" % e
        else:
            want = (code // 10000, (code // 100) % 100, code % 100)
            if tuple(tv[:3]) != want:
                raise RuntimeError(
                    "torch.cuda.nccl.version() is %s, ringccl's is %s: torch is bound to "
                    "another NCCL" % (tv, want)
                )
            report["torch_nccl"] = tuple(tv)
    return report
