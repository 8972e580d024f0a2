#!/usr/bin/env python3
"""A stand-in for a PyTorch training job whose DataLoader worker leaks.

The trainer holds a "model" (~60 MB), then forks two DataLoader workers, as
torch.utils.data.DataLoader does with num_workers=2. Worker 1 leaks ~20 MB/s
(think of a cache that is never evicted); worker 0 stays flat. Inside a
300 MiB memory limit the kernel OOM-kills worker 1 within about 15 s, and the
trainer fails the way PyTorch does:

    RuntimeError: DataLoader worker (pid N) is killed by signal: Killed.

Without a limit the leak stops at 1 GiB and the job ends by itself in under
a minute. Standard library only.
"""

import multiprocessing as mp
import signal
import sys
import time

MB = 1 << 20
MODEL_BYTES = 60 * MB
CHUNK_BYTES = 4 * MB
CHUNK_EVERY_S = 0.2  # 20 MB/s
LEAK_CAP_BYTES = 1024 * MB
STEPS = 100
STEP_S = 0.5


def set_comm(name):
    # Recent PyTorch names its processes so; tools that show `comm` see this.
    try:
        with open("/proc/self/comm", "w") as f:
            f.write(name)
    except OSError:
        pass


def touched(nbytes, byte):
    # Repeating a byte writes every page, so the memory is really resident.
    return bytearray([byte]) * nbytes


def worker(wid, leaks, stop):
    set_comm("pt_data_worker")
    cache = []
    while not stop.is_set():
        if leaks and len(cache) * CHUNK_BYTES < LEAK_CAP_BYTES:
            cache.append(touched(CHUNK_BYTES, 0x5A))
            if len(cache) % 10 == 0:
                print(f"worker {wid}: cache holds {len(cache) * CHUNK_BYTES // MB} MB", flush=True)
        time.sleep(CHUNK_EVERY_S)


def main():
    set_comm("pt_main_thread")
    model = touched(MODEL_BYTES, 0x01)
    ctx = mp.get_context("fork")
    stop = ctx.Event()
    # Daemonic, like PyTorch's workers: they die with the trainer.
    workers = [
        ctx.Process(target=worker, args=(wid, wid == 1, stop), name=f"DataLoader worker {wid}", daemon=True)
        for wid in range(2)
    ]
    for w in workers:
        w.start()
    print(f"trainer: model {len(model) // MB} MB, workers {[w.pid for w in workers]}", flush=True)

    for step in range(1, STEPS + 1):
        time.sleep(STEP_S)
        for w in workers:
            if w.exitcode is not None:
                # PyTorch's message, from its SIGCHLD handler.
                if w.exitcode < 0:
                    why = f"is killed by signal: {signal.strsignal(-w.exitcode)}."
                else:
                    why = f"exited unexpectedly with exit code {w.exitcode}."
                raise RuntimeError(f"DataLoader worker (pid {w.pid}) {why}")
        if step % 10 == 0:
            print(f"trainer: step {step}/{STEPS}", flush=True)

    stop.set()
    for w in workers:
        w.join()
    print("trainer: done", flush=True)


if __name__ == "__main__":
    sys.exit(main())
