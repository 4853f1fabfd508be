"""Example rank programs for the mock GPU API (see README "Writing a program").

Each function receives ``gpu`` (emulator.engine.api.GPU) and launches work on its streams.
"""


def data_parallel_step(gpu):
    """Forward, backward with a gradient all-reduce overlapping the rest of the backward."""
    grads = gpu.alloc(gpu.args.get("grad_bytes", 1 << 30), "grads")
    for _ in range(gpu.args.get("iterations", 3)):
        gpu.compute("forward", flops=gpu.args.get("flops", 4e12), bytes=2e9)
        gpu.compute("backward.half1", flops=gpu.args.get("flops", 4e12), bytes=2e9)
        work = gpu.all_reduce(gpu.args.get("grad_bytes", 1 << 30) // 2, async_op=True)
        gpu.compute("backward.half2", flops=gpu.args.get("flops", 4e12), bytes=2e9)
        gpu.all_reduce(gpu.args.get("grad_bytes", 1 << 30) // 2, async_op=True).wait()
        work.wait()
        gpu.compute("optimizer", bytes=16 * 2**30 // 8, kind="elementwise")
        gpu.mark_iteration()
    gpu.free(grads)


def ping_pong(gpu):
    """Point-to-point: each rank of the first half of the cluster sends to its partner in the second
    half (another node, often another rack), which answers."""
    size = gpu.args.get("size", 1 << 20)
    half = gpu.world_size // 2
    first = gpu.rank < half
    peer = gpu.rank + half if first else gpu.rank - half
    for _ in range(gpu.args.get("iterations", 4)):
        if first:
            gpu.send(peer, size)
            gpu.recv(peer, size)
        else:
            gpu.recv(peer, size)
            gpu.send(peer, size)
        gpu.mark_iteration()


def deadlock(gpu):
    """A classic bug: every rank receives from its neighbour before sending to it."""
    peer = (gpu.rank + 1) % gpu.world_size
    prev = (gpu.rank - 1) % gpu.world_size
    gpu.recv(prev, 1 << 20)
    gpu.send(peer, 1 << 20)


def mismatch(gpu):
    """Another classic: rank 1 skips a branch and issues all_gather where the others all_reduce."""
    gpu.compute("forward", flops=1e12)
    if gpu.rank == 1:
        gpu.all_gather(64 << 20)
    else:
        gpu.all_reduce(64 << 20)
    gpu.mark_iteration()


def out_of_memory(gpu):
    """Allocates more than the GPU holds."""
    blocks = [gpu.alloc(16 << 30, f"activations.{i}") for i in range(8)]
    for b in blocks:
        gpu.free(b)
