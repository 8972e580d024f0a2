#!/usr/bin/env python3
"""A real PyTorch CUDA job for `cargo xtask gpu-check` (docs/gpu.md).

    python torch_job.py MODE      MODE: default, expandable or async
    python torch_job.py --probe   is torch importable, is CUDA available?

MODE picks PyTorch's CUDA allocator through PYTORCH_CUDA_ALLOC_CONF, set here
before torch is imported (whatever the caller's environment says):

    default      unset: the native caching allocator (cudaMalloc segments)
    expandable   expandable_segments:True (cuMemCreate/cuMemMap pages)
    async        backend:cudaMallocAsync (the driver's stream-ordered pool)

The job allocates a known pattern on cuda:0 (3 x 256 MiB, frees one, then
512 MiB), runs one matmul (cuBLAS makes its handle and workspace), then a
DataLoader with num_workers=2 and pin_memory=True over a synthetic dataset:
the workers make CPU tensors, the main process's pin-memory thread copies
them into pinned host memory, and the main process moves them to the GPU.

At the end it waits a few seconds (so that the recorder's once-a-second NVML
samples see the final state), prints one line on stdout,

    TORCH {"mode": ..., "reserved_bytes": ..., ...}

and leaves with os._exit(0): no interpreter teardown, so what the process
holds at exit is exactly what the line reports. Exit status 3: torch could
not be imported; 4: CUDA is not available; 2: bad arguments.
"""

import json
import os
import sys
import time

MIB = 1 << 20
MODES = {
    "default": None,
    "expandable": "expandable_segments:True",
    "async": "backend:cudaMallocAsync",
}

# The synthetic dataset: ITEMS items of ITEM_FLOATS float32 (4 MiB each),
# batches of BATCH (16 MiB pinned per batch).
ITEMS = 32
ITEM_FLOATS = 1 << 20
BATCH = 4
# Seconds to hold the final state before printing and exiting.
SETTLE_S = 2.5


def import_torch():
    try:
        import torch  # noqa: F401  (imported for the caller)
    except Exception as e:  # ImportError, or a broken install's OSError
        print(f"torch is not importable: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(3)
    return torch


def probe():
    torch = import_torch()
    available = torch.cuda.is_available()
    info = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "available": available,
        "devices": torch.cuda.device_count() if available else 0,
        "device_name": torch.cuda.get_device_name(0) if available else None,
        "python": sys.version.split()[0],
    }
    print("PROBE " + json.dumps(info), flush=True)


def make_dataset(torch):
    from torch.utils.data import Dataset

    class Synthetic(Dataset):
        """Item i is ITEM_FLOATS copies of i: made in the worker, on the CPU."""

        def __len__(self):
            return ITEMS

        def __getitem__(self, i):
            return torch.full((ITEM_FLOATS,), float(i), dtype=torch.float32)

    return Synthetic()


def job(mode):
    conf = MODES[mode]
    if conf is None:
        os.environ.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    else:
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = conf
    torch = import_torch()
    from torch.utils.data import DataLoader

    if not torch.cuda.is_available():
        print("torch.cuda.is_available() is False", file=sys.stderr)
        sys.exit(4)
    dev = torch.device("cuda", 0)

    def block(mib):
        # Written, not just reserved: the driver backs it for real.
        return torch.ones(mib * MIB, dtype=torch.uint8, device=dev)

    held = [block(256) for _ in range(3)]
    torch.cuda.synchronize()
    del held[1]
    held.append(block(512))
    x = torch.randn(1024, 1024, device=dev)
    held.append(x @ x)
    torch.cuda.synchronize()

    loader = DataLoader(
        make_dataset(torch),
        batch_size=BATCH,
        num_workers=2,
        pin_memory=True,
    )
    batches = pinned = 0
    total = torch.zeros((), device=dev)
    for batch in loader:
        batches += 1
        pinned += int(batch.is_pinned())
        total += batch.to(dev, non_blocking=True).sum()
    expected = float(sum(range(ITEMS)) * ITEM_FLOATS)
    got = float(total.item())
    if abs(got - expected) > expected * 1e-3:
        print(f"DataLoader sum {got}, expected {expected}", file=sys.stderr)
        sys.stdout.flush()
        os._exit(5)
    del loader, total
    torch.cuda.synchronize()
    time.sleep(SETTLE_S)

    free, total_dev = torch.cuda.mem_get_info(dev)
    figures = {
        "mode": mode,
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
        "backend": getattr(torch.cuda, "get_allocator_backend", lambda: None)(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device_name": torch.cuda.get_device_name(dev),
        "pid": os.getpid(),
        "reserved_bytes": torch.cuda.memory_reserved(dev),
        "max_reserved_bytes": torch.cuda.max_memory_reserved(dev),
        "allocated_bytes": torch.cuda.memory_allocated(dev),
        "max_allocated_bytes": torch.cuda.max_memory_allocated(dev),
        # cudaMemGetInfo: the whole device, every process and the contexts.
        "device_used_bytes": total_dev - free,
        "device_total_bytes": total_dev,
        "batch_bytes": BATCH * ITEM_FLOATS * 4,
        "batches": batches,
        "pinned_batches": pinned,
        "held_tensors": len(held),
    }
    print("TORCH " + json.dumps(figures), flush=True)
    sys.stderr.flush()
    os._exit(0)


def main():
    if sys.argv[1:] == ["--probe"]:
        probe()
    elif len(sys.argv) == 2 and sys.argv[1] in MODES:
        job(sys.argv[1])
    else:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
