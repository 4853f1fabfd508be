"""A rank's plain pipeline steps run from a *tape*: the built-in training program hands the engine a
run of them in one call (api.GPU.run_tape) instead of launching each step's ops itself.

A step is what training.py's forward / backward launch for a middle stage's microbatch when
nothing else runs between them: a pipeline receive and its ``wait()``, one layer block the compiled
per-op engine takes (opcore.py: an eligible template, with its memory rows), and a pipeline send.
The program stays the specification: a tape launches the same ops, through the same calls
(Shard.launch, OpCore.begin / launch_rest), in the same order, at the same moments - so every
stream position, dependency, event key, statistic and error is the program's. What goes is the
program's own Python per step (its frames, its dictionary look-ups, the GPU API's calls) and
most greenlet switches: the program's greenlet stays suspended while its tape runs, and where the
program would have been suspended half way through a step (Shard.launch at ``max_ops_ahead``
outstanding ops, OpCore.launch waiting for room in the kernels' ring) the tape keeps its place
(:attr:`Tape.i`, :attr:`Tape.phase`) and Shard._maybe_resume runs it on, as it would have
switched to the program there. (A program never waits for a receive - ``wait()`` orders the
compute stream after it - so it is suspended only at ``max_ops_ahead``: with the default 256 the
reference run switched 64,374 times for its 393,216 steps, 2,994 times with tapes.) The ops
themselves, their Python rules and the kernel calls that start and complete them are the same:
a tape is the interface a compiled executor of the steps would take (docs/performance.md).

Where a rank's next actions are not plain steps (the first and last stage's embedding and logits,
the last microbatch's gradient buckets, ZeRO-3, overlapped weight gathers, a block the kernels do
not take, a traced rank), the program runs them itself, as without a tape.

A tape's sends to ranks of its own shard run in the kernels (one to another shard stays a Python
op, which the lookahead of several shards reads: lookahead.py): OpCore.launch_send makes each an op
of the kernels' ring on its stream's slot, after the block's last op, whose completion starts it in
the kernels (netkernels' injection; its completion an event of the kernels' heap keyed from the
rank's counter, as p2p.PointToPoint._start_send would push it). On one shard a tape's receives
do too (OpCore.launch_recv): released by the previous
block's last op, matched in the message core's table by start_receive's rules (a message in the
mailbox completes it at once or at its delivery, in the kernels; one still to come completes it at
its hand-over, RECV_DONE, one kernel call), and the next block's first op waits for it in the
kernels (its proxy then waits for nothing of Python's). So a step's send and receive take no Python
after their launch but that one call. The shard's streams hold one stand-in op meanwhile; Python
hands a stream back where it launches on it or waits for every stream (OpCore.seal, drained).

With ``EMULATOR_TAPE=steps`` a step's launches after its block's proxy take one
kernel call (OpCore.launch_step, opkernels.launch_step): the block's rest, its send and the next
step's receive, where no Python would run between them (the block launched to its end with no
instant op stopping it, the program not to be suspended in between: their checks, made before the
call, see what they would see after the block); else as many calls as with ``kernel``. A receive
completed at its hand-over completes inside the message core's run, which goes on unless Python
must act (opkernels.run_net: no kernel call from Python per receive, as with ``kernel``). A proxy is
still a Python op, started by a kernel call of its own where it becomes its stream's head.

With ``EMULATOR_TAPE=blocks`` (one shard, as the receives) a block queued behind
another starts in the kernels where that one ends, and that one's proxy completes there too
(opstreams._chain, and _instant for a block ending with an alloc or free: the same counts, event
keys and order), where its proxy waits for nothing of Python's and nothing of Python's waits for
the proxy before it (Shard._launch_block_compiled writes R_AUTO, the block's first op takes O_GATE
2; not on a rank whose time a fault changes). The program's check after the ended proxy is the
kernels' (ST_RESUME); where the Python rules would resume the program before the next block starts
(a block ending with a free, no receive released at once) the kernels stop as before (ST_IBLOCK).
Python's copy of the compute stream lags meanwhile - done proxies still queued, the running one not
marked started - and OpCore.settle brings it up to date where Python next reads it: a block's end
the kernels hand to Python, an instant op's stop, the program's resumption, an out-of-memory
report, a deadlock report and the figures (ShardStats.flush). What a lagging copy could change
does not happen meanwhile: a done proxy had no dependents, no Python op can become the head behind
a running block, and the lengths Shard.launch compares are above one either way.

With ``EMULATOR_TAPE=arrays`` (the default: as ``blocks``; one shard, the dedicated rules) a run of
chained steps is launched in one kernel call (OpCore.launch_steps, opkernels.launch_steps) from a
step's phase 1 where its block would chain (the R_AUTO conditions above) and its send and the next
step's receive go to kernel slots with known descriptors: the kernels make each step's proxy's part
(R_BEGIN, R_AUTO, one more outstanding op) and launch_step's, step after step, stopping before a
step whose proxy would suspend the program and after one whose status leaves Python something to
do; Python then makes the launched steps' proxies (Shard._queue_chained), Allocations and ``held``
entries in the same order with the same values, and the last step's phase 2 goes on with
launch_step's status for it (tasks i24k, i24l: docs/performance.md).

``EMULATOR_TAPE=0`` in the environment turns tapes off (the program launches every step itself),
``EMULATOR_TAPE=python`` keeps a tape's messages in Python (the specification of the kernels'),
``sends`` runs only its sends in the kernels, ``kernel`` its sends and receives with a kernel call
each, ``steps`` as ``kernel`` with a step's calls fused, ``blocks`` as ``steps`` with
its blocks chained, ``arrays`` as ``blocks`` with runs of steps in one call: tests/emulator/engine/
test_tape.py, test_tape_steps.py, test_tape_blocks.py and test_tape_arrays.py compare whole runs these
ways, bit for bit.
The driver reads it once into the engine settings (settings.tape_mode, EngineSettings.tape) and every
shard runs that mode, Ray actors too, wherever their cluster was started (tests/actors/test_tape_ray.py).
"""

from __future__ import annotations

from emulator.engine.opkernels import ST_SUSPEND
from emulator.engine.opmessages import ST_SENT, ST_STEPPED
from emulator.engine.ops import Op
from emulator.engine.settings import TAPE_MODES
from emulator.engine.settings import tape_mode as _mode

MODES = TAPE_MODES  # ("1": tapes on, in Python, as "python")


def enabled(mode: str | None = None) -> bool:
    """Whether shards run tapes in ``mode`` (EngineSettings.tape; None: this process's EMULATOR_TAPE)."""
    return (mode or _mode()) != "0"


def kernel_sends(mode: str | None = None) -> bool:
    """Whether a tape's pipeline sends run in the kernels: alone (``EMULATOR_TAPE=sends``) or with
    its receives (``kernel``, ``steps``, ``blocks`` or ``arrays``, the default); a tape in Python with
    ``python`` (or ``1``)."""
    return (mode or _mode()) in ("sends", "kernel", "steps", "blocks", "arrays")


def kernel_receives(mode: str | None = None) -> bool:
    """Whether a tape's pipeline receives run in the kernels too (``EMULATOR_TAPE=kernel`` or
    ``steps``, ``blocks`` or ``arrays``, the default; one shard only: Shard.kernel_receives)."""
    return (mode or _mode()) in ("kernel", "steps", "blocks", "arrays")


def fused_steps(mode: str | None = None) -> bool:
    """Whether a step's block, its send and the next step's receive are launched in one kernel call
    (``EMULATOR_TAPE=steps``, ``blocks`` or ``arrays``, the default; OpCore.launch_step) rather than one call each
    (``kernel``)."""
    return (mode or _mode()) in ("steps", "blocks", "arrays")


def kernel_blocks(mode: str | None = None) -> bool:
    """Whether a step's block queued behind another starts in the kernels where that one ends, its
    proxy completed there too (``EMULATOR_TAPE=blocks``: as ``steps``, plus opstreams._chain and
    OpCore.settle; one shard only: Shard.chain_blocks)."""
    return (mode or _mode()) in ("blocks", "arrays")


def batched_steps(mode: str | None = None) -> bool:
    """Whether a run of a tape's chained steps is launched in one kernel call (``EMULATOR_TAPE=arrays``:
    as ``blocks``, plus OpCore.launch_steps; one shard, the dedicated rules: Shard.batch_steps)."""
    return (mode or _mode()) == "arrays"


class Tape:
    """A run of a rank's pipeline steps and how far the engine has launched them.

    ``steps``: ``(recv, known, alloc_key, alloc_name, free_key, send, suffix)`` each, where ``recv`` and
    ``send`` are ``(api.GPU.prepare_p2p's message, stream)`` or None, ``known`` the block's entry
    (OpCore.known, eligible), ``alloc_key`` / ``alloc_name`` where the block's alloc row's
    allocation goes in ``held`` and the name it takes (slot 0, as training.forward passes it), and
    ``free_key`` the key in ``held`` of the allocation its free row frees (slot 1, as
    training.backward passes it), ``suffix`` its compute ops' names' (launch_prepared's: a
    deadlock report names them); ``held`` is the program's map of live allocations."""

    __slots__ = ("shard", "gpu", "core", "steps", "held", "i", "phase", "op", "memory")

    def __init__(self, shard, gpu, steps: list, held: dict):
        self.shard = shard
        self.gpu = gpu
        self.core = shard.ops_core
        self.steps = steps
        self.held = held
        self.i = 0  # the step being launched
        self.phase = 0  # 0: its receive, 1: its block's proxy, 2: the block's rest, 3: its send
        # where run() returned half way through step ``i`` (run keeps them in locals meanwhile):
        self.op = None  # the step's receive (its wait() comes after the launch)
        self.memory = None  # the step's block's allocations by slot

    def run(self) -> bool:
        """Launch steps until the program would be suspended (False) or the tape ends (True)."""
        shard, gpu, core = self.shard, self.gpu, self.core
        steps = self.steps
        i, phase = self.i, self.phase
        # the step's receive and its block's allocations (``op``, ``memory``) in locals, stored in
        # the tape only where it returns (two attribute stores and loads less per step)
        op, memory = self.op, self.memory
        n = len(steps)
        # (``gpu._susp``: CompiledGPU.suspended without its property: a tape runs on those only)
        launch = shard.launch_p2p  # (Shard.launch's rules for a send or receive the kernels do not take)
        kernel_sends = shard.kernel_sends
        kernel_receives = shard.kernel_receives
        fused = shard.fused_steps
        batch = shard.batch_steps
        held = self.held
        # (the core's methods bound once per run, not once per step)
        claim, begin_step, launch_step = core.claim, core.begin_step, core.launch_step
        while i < n:
            recv, known, alloc_key, alloc_name, free_key, send, suffix = steps[i]
            status = None  # (launch_steps': the status launch_step gave its last step)
            if phase == 0:
                phase = 1
                if recv is not None:
                    if kernel_receives and core.launch_recv(gpu, recv[0], recv[1]):
                        op = None  # (the block's wait for it is the kernels': opkernels.R_RPEND)
                    else:
                        op = Op(*recv[0])
                        launch(gpu, op, recv[1])
                    if gpu._susp:
                        self.i, self.phase, self.op = i, phase, op
                        return False
            if phase == 1 and batch and op is None:
                # steps from here to the kernels in one call, up to the one launched last, whose
                # phase 2 goes on with launch_step's status for it (OpCore.launch_steps)
                got = core.launch_steps(gpu, steps, i, held)
                if got is not None:
                    i, memory, status = got
                    recv, known, alloc_key, alloc_name, free_key, send, suffix = steps[i]
                    phase = 2
            if phase == 1:
                phase = 2
                after = None
                if op is not None:  # (None: no receive, or the kernels' receive)
                    if not op.done:  # (its wait() on "compute": begin_step takes it)
                        after = op
                    op = None
                memory = [alloc_name, held.pop(free_key) if free_key is not None else None]
                claimed = claim(gpu, known)
                assert claimed, "a tape's block the kernels do not take"
                core.suffix = suffix
                begin_step(gpu, known, memory, after)
                if gpu._susp:
                    self.i, self.phase, self.op, self.memory = i, phase, None, memory
                    return False
            if phase == 2:
                if status is not None:
                    pass  # (launched by launch_steps)
                elif fused:  # the block's rest, its send and the next step's receive in one kernel call
                    status = launch_step(gpu, send, steps[i + 1][0] if i + 1 < n and kernel_receives else None)
                else:
                    status = core.launch_rest(gpu)
                if status == ST_SUSPEND:  # no room in the kernels' ring yet
                    shard._suspend(gpu)
                    self.i, self.phase, self.op, self.memory = i, phase, None, memory
                    return False
                phase = 3
                if alloc_key is not None:
                    held[alloc_key] = memory[0]
                memory = None
                if status >= ST_SENT:  # (phase 3 done, and with ST_STEPPED the next step's phase 0)
                    i += 1
                    phase = 0
                    if status == ST_STEPPED:  # (its wait is the kernels', as launch_recv's)
                        phase = 1
                    if gpu._susp:  # Shard.launch's check after the send (or the receive)
                        self.i, self.phase, self.op, self.memory = i, phase, None, None
                        return False
                    continue
                if gpu._susp:  # Shard.launch's check after a last alloc or free row
                    self.i, self.phase, self.op, self.memory = i, phase, None, None
                    return False
            # phase 3
            i += 1
            phase = 0
            if send is not None:
                if not (kernel_sends and core.launch_send(gpu, send[0], send[1])):
                    launch(gpu, Op(*send[0]), send[1])
                if gpu._susp:
                    self.i, self.phase, self.op, self.memory = i, phase, None, None
                    return False
        self.i, self.phase, self.op, self.memory = i, 0, None, None
        return True
