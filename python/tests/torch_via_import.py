"""Runs a torch script after ``import ringccl.torch`` (no LD_PRELOAD), and checks the binding.

    torchrun --nproc-per-node 2 python/tests/torch_via_import.py SCRIPT [ARGS...]

``ringccl.torch`` is imported before torch; once torch is imported and its NCCL binding used
(``torch.cuda.nccl.version()``), ``ringccl.torch.check()`` must find ringccl's library and no
other NCCL in the process. Then SCRIPT runs as ``__main__`` in the same process.
"""

import os
import runpy
import sys

assert "LD_PRELOAD" not in os.environ or "ringccl" not in os.environ["LD_PRELOAD"], (
    "this check is of the import, not of LD_PRELOAD"
)
import ringccl.torch  # noqa: E402  (before torch: the point of the check)
import torch  # noqa: E402

report = ringccl.torch.check()
assert isinstance(report.get("torch_nccl"), tuple), report
print("[rank %s] ringccl.torch.check(): %s" % (os.environ.get("RANK", "0"), report), flush=True)

script = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(script, run_name="__main__")
