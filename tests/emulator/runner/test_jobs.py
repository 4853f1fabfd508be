"""Several jobs on one cluster (emulator/config/jobs.py, emulator/runner/jobs.py): validation, placement,
job-local ranks, equality with the jobs run alone, contention where they share links, shards."""

from __future__ import annotations

import json

import pytest

from emulator.config.jobs import Slots, job_cluster, job_ranks, place
from emulator.config.loader import load_run, load_run_dict
from emulator.config.schema import ClusterConfig, JobConfig, RunConfig
from emulator.config.typed import from_dict
from emulator.engine.placement import shard_layout
from emulator.engine.settings import EngineSettings
from emulator.errors import ConfigError, ProgramError
from emulator.runner.sequence import execute, run_job
from netmodel.topology import Topology
from tests.conftest import CONFIGS, cluster_dict

EXAMPLE = CONFIGS / "runs/two-jobs-shared-nics.yaml"
PROGRAMS = CONFIGS / "examples/programs.py"
ONE_ITERATION = ["jobs.0.training.iterations=1", "jobs.1.training.iterations=1"]


def _jobs_config(jobs: list[dict], nodes: int = 4, placement: str = "packed", **top) -> RunConfig:
    data = {"cluster": cluster_dict(nodes=nodes), "placement": placement, "jobs": jobs, **top}
    return from_dict(RunConfig, data, "")


def _dp_job(name: str, **where) -> dict:
    return {"name": name, "program": f"{PROGRAMS}:data_parallel_step",
            "program_args": {"iterations": 1, "grad_bytes": 1 << 26}, **where}  # fmt: skip


# -- validation -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("jobs", "top", "message"),
    [
        ([], {}, "jobs: the list is empty"),
        ([_dp_job("a", nodes=1)], {"model": "x"}, "model"),
        ([_dp_job("a", nodes=1), _dp_job("a", nodes=1)], {}, "two jobs are named 'a'"),
        ([_dp_job("a b", nodes=1)], {}, "jobs[0].name: 'a b' is not a job name"),
        ([_dp_job("a", nodes=1, gpus=8)], {}, "jobs[0]: give exactly one of nodes, gpus, node_ids, slots (got nodes"),
        ([_dp_job("a")], {}, "jobs[0]: give exactly one of nodes, gpus, node_ids, slots"),
        ([_dp_job("a", nodes=0)], {}, "jobs[0].nodes must be >= 1"),
        ([_dp_job("a", node_ids=[1, 1])], {}, "jobs[0].node_ids: [1, 1] repeats a node"),
        ([_dp_job("a", node_ids=[0, 1]), _dp_job("b", node_ids=[1])], {},
         "jobs[1].node_ids: GPUs 0..7 of node 1 are already taken by job a"),
        ([_dp_job("a", node_ids=[4])], {}, "jobs[0].node_ids: node 4 is not in the cluster (nodes 0..3)"),
        ([_dp_job("a", slots=[{"node": 0, "gpus": 4, "first_gpu": 6}])], {},
         "jobs[0].slots: node 0 has GPUs 0..7, not 6..9"),
        ([_dp_job("a", slots=[{"node": 0, "gpus": 4}]), _dp_job("b", slots=[{"node": 0, "gpus": 2, "first_gpu": 3}])],
         {}, "jobs[1].slots: GPUs 3..4 of node 0 are already taken by job a"),
        ([_dp_job("a", nodes=3), _dp_job("b", nodes=2)], {},
         "jobs[1] (b): no room left on the cluster: 4 nodes (32 GPUs) are free for the jobs placed by policy"),
        ([_dp_job("a", node_ids=[0]), _dp_job("b", gpus=32)], {}, "jobs[1] (b): no room left on the cluster: 3 nodes"),
        ([_dp_job("a", gpus=16), _dp_job("b", gpus=10)], {"placement": "spread"},
         "jobs[1]: placement spread puts every job on 4 nodes; b's 10 GPUs are not a multiple of 4"),
        ([{"name": "a", "nodes": 1}], {}, "jobs[0] (a): the run needs either 'program"),
        ([{"name": "a", "nodes": 1, "model": {"num_layers": 2}, "parallel": {"data": 16}}], {},
         "jobs[0] (a): parallel: tensor(1) * context(1) * pipeline(1) * data(16) = 16 != world size 8"),
        ([{**_dp_job("a", nodes=1), "faults": {}}], {}, "unknown key 'jobs[0].faults'"),
        ([{**_dp_job("a", nodes=1), "cluster": {"nodes": 1, "gpu": "h100-sxm-80gb"}}], {},
         "jobs[0].cluster: the job's own cluster has h100-sxm-80gb GPUs but it gets rank 0, a a100-sxm-80gb"),
    ],
)
def test_invalid_jobs_are_one_line_config_errors(jobs, top, message):
    """Every mistake in a jobs section is one ConfigError line naming the key path or the job."""
    with pytest.raises(ConfigError) as err:
        _jobs_config(jobs, **top)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_job_run_files_and_set(tmp_path):
    """``run:`` takes a run file (relative to the jobs file), the job's keys override it, ``--set``
    reaches into the jobs; a run file with faults or jobs of its own is refused."""
    (tmp_path / "dp.yaml").write_text(f"program: {PROGRAMS}:data_parallel_step\nprogram_args: {{iterations: 3}}\n"
                                      "cluster: {nodes: 1, gpus_per_node: 8}\n")  # fmt: skip
    jobs_file = tmp_path / "jobs.yaml"
    jobs = "jobs:\n  - {run: dp.yaml}\n  - {run: dp.yaml, name: b, program_args: {iterations: 1}}\n"
    jobs_file.write_text(f"cluster: {json.dumps(cluster_dict(nodes=2))}\n{jobs}")
    config = load_run(jobs_file, ["jobs.1.program_args.iterations=2"])
    first, second = config.jobs
    assert (first.name, first.gpus, first.program_args) == ("dp", 8, {"iterations": 3})
    assert (second.name, second.program_args) == ("b", {"iterations": 2})
    assert [s.node for s in first.placed] == [0] and [s.node for s in second.placed] == [1]
    (tmp_path / "bad.yaml").write_text("faults: {seed: 1}\n")
    with pytest.raises(ConfigError, match=r"jobs\[0\].run: bad.yaml has 'faults'; a job is one run"):
        load_run(jobs_file, ["jobs.0.run=bad.yaml"])
    with pytest.raises(ConfigError, match=r"jobs\[0\].run: jobs.yaml has 'jobs'"):
        load_run(jobs_file, ["jobs.0.run=jobs.yaml"])  # a jobs file naming itself: refused, no recursion


# -- placement --------------------------------------------------------------------------------------


def _placed(jobs: list[dict], policy: str, nodes: int = 4) -> list[list[tuple[int, int, int]]]:
    cluster = from_dict(ClusterConfig, cluster_dict(nodes=nodes), "cluster")
    typed = [from_dict(JobConfig, j, f"jobs[{i}]") for i, j in enumerate(jobs)]
    return [[(s.node, s.first_gpu, s.gpus) for s in slots] for slots in place(cluster, typed, policy)]


def test_packed_fills_the_next_free_gpus_in_rank_order():
    """packed: a job of G GPUs takes the next G free GPUs; a job of whole nodes starts a node; named
    nodes are skipped."""
    jobs = [{"name": "a", "gpus": 12}, {"name": "b", "gpus": 4}, {"name": "c", "nodes": 1},
            {"name": "d", "node_ids": [2]}]  # fmt: skip
    assert _placed(jobs, "packed", nodes=5) == [[(0, 0, 8), (1, 0, 4)], [(1, 4, 4)], [(3, 0, 8)], [(2, 0, 8)]]


def test_spread_splits_every_node_in_one_block_per_job():
    """spread: k jobs of G_j GPUs on F = sum(G)/8 nodes; job j has GPUs [sum_{i<j} G_i/F, ...) of each."""
    jobs = [{"name": "a", "gpus": 16}, {"name": "b", "gpus": 8}, {"name": "c", "nodes": 1}]
    f = (16 + 8 + 8) // 8
    assert _placed(jobs, "spread", nodes=5) == [
        [(n, 0, 16 // f) for n in range(f)],
        [(n, 16 // f, 8 // f) for n in range(f)],
        [(n, 24 // f, 8 // f) for n in range(f)],
    ]


def test_job_ranks_and_cluster():
    """A job's ranks are its GPUs in node order; its cluster has a node per node it has GPUs on."""
    cluster = from_dict(ClusterConfig, cluster_dict(nodes=4), "cluster")
    slots = [Slots(1, 4, 4), Slots(3, 4, 4), Slots(2, 8)]
    assert job_ranks(cluster, slots) == (*range(12, 16), *range(28, 32), *range(16, 24))
    own = job_cluster(cluster, slots, "a")
    assert [(g.nodes, g.gpus_per_node) for g in own.groups()] == [(2, 4), (1, 8)] and own.world_size == 16


def test_shards_are_cut_between_jobs():
    """Two shards of two packed jobs are one job each; a node shared by two jobs is a unit of its own."""
    config = load_run(EXAMPLE)
    layout, _ = shard_layout(Topology(config.cluster), 2, EngineSettings.from_run_config(config))
    assert layout == [list(range(16)), list(range(16, 32))]


# -- running ----------------------------------------------------------------------------------------


def test_a_job_alone_equals_its_plain_run(tmp_path):
    """A run file as the only job of a jobs run on the same cluster: the same results, bit for bit."""
    run_file = CONFIGS / "runs/bloom-560m-zero2.yaml"
    overrides = ["training.iterations=1", "cluster.nodes=2", "parallel.data=16", "training.global_batch_size=64"]
    plain, _, _ = execute(load_run(run_file, overrides))
    jobs_file = tmp_path / "one-job.yaml"
    job = f"  - run: {run_file}\n    nodes: 2\n    parallel: {{data: 16}}\n"
    jobs_file.write_text(f"cluster: {{from: dgx-a100-hdr, nodes: 2}}\njobs:\n{job}"
                         "    training: {iterations: 1, global_batch_size: 64}\n")  # fmt: skip
    shared, _, _ = execute(load_run(jobs_file))
    job = shared["jobs"][0]
    assert shared["fingerprint"] == plain["fingerprint"]
    assert job["iteration_times_s"] == plain["iteration_times_s"] and job["mfu"] == plain["mfu"]


def test_jobs_on_separate_nodes_equal_alone_and_sharing_nics_is_slower():
    """packed (a rack each): each job as fast as alone. spread (both on every node, sharing its
    NICs and their 3:1 uplink shares): each slower than alone on the same GPUs, and the shared
    uplink shares carry exactly both jobs' bytes."""
    alone, _, _ = _run_single(EXAMPLE, ONE_ITERATION)
    packed, _, _ = execute(load_run(EXAMPLE, ONE_ITERATION))
    assert [j["iteration_times_s"] for j in packed["jobs"]] == [alone["jobs"][0]["iteration_times_s"]] * 2
    spread_slots = [f"jobs.0.slots=[{', '.join(f'{{node: {n}, gpus: 4}}' for n in range(4))}]", "jobs.0.gpus=null"]
    solo, solo_result, _ = _run_single(EXAMPLE, [*ONE_ITERATION, *spread_slots])
    spread, result, topo = execute(load_run(EXAMPLE, [*ONE_ITERATION, "placement=spread"]))
    for job in spread["jobs"]:
        assert job["iteration_time_s"] > solo["jobs"][0]["iteration_time_s"] > packed["jobs"][0]["iteration_time_s"]
    uplink = topo.link_name.index("node1.nic0.tor-spine.up")
    assert result.links[uplink][0] == 2 * solo_result.links[uplink][0] > 0


def _run_single(path, overrides):
    """The example with job b removed (job a alone where the overrides put it)."""
    data, _ = load_run_dict(path, overrides)
    data["jobs"] = data["jobs"][:1]
    return execute(from_dict(RunConfig, data, ""))


def test_two_shards_give_the_same_results():
    """Jobs sharing nodes, on 1 and 2 in-process shards: the same results, bit for bit."""
    overrides = [*ONE_ITERATION, "placement=spread"]
    one, _, _ = execute(load_run(EXAMPLE, overrides), "inline", 1)
    two, _, _ = execute(load_run(EXAMPLE, overrides), "inline", 2)
    assert two["fingerprint"] == one["fingerprint"] and two["jobs"] == one["jobs"] and two["rounds"] > 1


def test_programs_see_job_ranks_and_each_job_gets_a_run_directory(tmp_path):
    """A user program in two jobs: each sees ranks 0..n-1 of its own world (ping-pong pairs rank r
    with r + n/2 of its job); jobs/<name>/ holds its summary, config and ranks numbered 0..n-1."""
    jobs = [{"name": n, "program": f"{PROGRAMS}:ping_pong", "program_args": {"iterations": 2}, "gpus": 8}
            for n in ("a", "b")]  # fmt: skip
    config = _jobs_config(jobs, nodes=2, placement="spread")
    done = run_job(config, out=tmp_path / "run")
    assert [j["iterations"] for j in done.summary["jobs"]] == [2, 2]
    assert done.summary["jobs"][0]["placement"] == [{"node": 0, "gpus": 4, "first_gpu": 0},
                                                    {"node": 1, "gpus": 4, "first_gpu": 0}]  # fmt: skip
    folder = tmp_path / "run/jobs/b"
    ranks = (folder / "ranks.csv").read_text().splitlines()
    assert [line.split(",")[:2] for line in ranks[1:]] == [[str(r), str(r // 4)] for r in range(8)]
    assert json.loads((folder / "summary.json").read_text())["iterations"] == 2
    again = load_run(tmp_path / "run/config.yaml")  # the resolved config reruns the same run
    assert execute(again)[0]["fingerprint"] == done.summary["fingerprint"]
    from emulator.reports.run_report import write_report
    from emulator.results.compare import compare

    rows = {r["key"]: r for r in compare(tmp_path / "run", tmp_path / "run")["results"]}
    assert "jobs.a.iteration_time_s" in rows and write_report(tmp_path / "run")[0].is_file()


def test_a_job_program_error_names_the_job(tmp_path):
    """A peer outside the job's world is out of the job's rank range, and the error names the job."""
    (tmp_path / "bad.py").write_text("def bad(gpu):\n    gpu.send(gpu.world_size, 8)\n")
    jobs = [_dp_job("a", gpus=8), {"name": "b", "gpus": 8, "program": f"{tmp_path / 'bad.py'}:bad"}]
    with pytest.raises(ProgramError, match=r"job b rank 0: send peer 8 is not another rank of 0..7"):
        execute(_jobs_config(jobs, nodes=2))
