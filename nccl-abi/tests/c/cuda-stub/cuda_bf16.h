/* Empty: nccl.h includes it, the ABI check uses nothing from it. */
