"""``ringccl-torchrun``: ``torchrun`` with ringccl's ``libnccl.so.2`` preloaded."""

import os
import shutil
import sys

import ringccl

USAGE = """usage: ringccl-torchrun [TORCHRUN ARGS...] SCRIPT [ARGS...]

Runs torchrun with ringccl's libnccl.so.2 in LD_PRELOAD, so that PyTorch in every worker
process binds to ringccl instead of the NCCL wheel. All arguments go to torchrun unchanged
(`torchrun --help` lists them); `torchrun` from PATH, else `python -m torch.distributed.run`.

  ringccl-torchrun --nproc-per-node 2 train.py

library: {lib}
"""


def main(argv=None):
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(USAGE.format(lib=ringccl.library_path()), end="")
        return 0
    lib = ringccl.library_path()
    if not os.path.isfile(lib):
        print("ringccl-torchrun: the library is missing: %s" % lib, file=sys.stderr)
        return 1
    env = dict(os.environ)
    pre = env.get("LD_PRELOAD", "")
    env["LD_PRELOAD"] = lib + (" " + pre if pre else "")
    torchrun = shutil.which("torchrun")
    cmd = [torchrun] + args if torchrun else [sys.executable, "-m", "torch.distributed.run"] + args
    os.execvpe(cmd[0], cmd, env)
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main())
