"""Rank programs for the Ray backend tests: traffic that crosses shard boundaries."""


def pipeline_data_parallel(gpu):
    """Pipeline stages of whole nodes: micro-batches go forward then backward from stage to stage
    (point to point across nodes), then each stage all-reduces its gradients over its nodes."""
    per_stage = gpu.args.get("nodes_per_stage", 2) * gpu.gpus_per_node
    stage = gpu.rank // per_stage
    stages = gpu.world_size // per_stage
    data_parallel = gpu.new_group(range(stage * per_stage, (stage + 1) * per_stage))
    prev = gpu.rank - per_stage if stage > 0 else None
    nxt = gpu.rank + per_stage if stage < stages - 1 else None
    act = gpu.args.get("activation_bytes", 8 << 20)
    micro = gpu.args.get("micro_batches", 4)
    for _ in range(gpu.args.get("iterations", 2)):
        for m in range(micro):
            if prev is not None:
                gpu.recv(prev, act, tag=m)
            gpu.compute("forward", flops=2e11)
            if nxt is not None:
                gpu.send(nxt, act, tag=m)
        for m in range(micro):
            if nxt is not None:
                gpu.recv(nxt, act, tag=1000 + m)
            gpu.compute("backward", flops=4e11)
            if prev is not None:
                gpu.send(prev, act, tag=1000 + m)
        gpu.all_reduce(gpu.args.get("grad_bytes", 32 << 20), group=data_parallel)
        gpu.mark_iteration()
