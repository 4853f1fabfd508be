"""Which ranks provably run the same stream: the script's reads of its own rank identity.

    emulator torchrun --nnodes 384 --nproc-per-node 8 configs/torch/dp_gpt.py   # 1 rank captured for 3072

A rank's stream is what a deterministic program does with its inputs. Under capture every input
is the same on every rank (the script, its arguments, fake tensors without values, seeded random
numbers) except the rank's identity. So the capture of rank ``r`` records every *use* the script's
own code makes of an identity it reads, as a predicate over the identity, with the answer ``r``
got; a rank ``r2`` for which every recorded predicate gives the same answer takes the same
decisions, reads the same values and so runs the same stream (it uses the same process groups when
it is a member of each, see emulator/capture/torchrun.py).

The sources are ``dist.get_rank()`` (with or without a group), ``dist.get_node_local_rank()``,
``ProcessGroup.rank()``, a ``DeviceMesh``'s ``get_rank``, ``get_local_rank`` and
``get_coordinate``, and the environment's ``RANK``, ``LOCAL_RANK``, ``GROUP_RANK``, ``NODE_RANK``
and ``ROLE_RANK``. Read by the script's code (a file in the script's folder), they return an
:class:`~emulator.capture.recorder.RankValue` carrying the expression below; arithmetic on it stays an
expression, a comparison or a truth test records ``[expression, answer]``, and any other use (an
index, a size, a string, a hash) records the exact value. An environment variable is read as an
:class:`~emulator.capture.recorder.EnvText`: the script's ``int()`` of it is the RankValue of
``["rank"]``, ``["local"]`` or ``["node"]``, any other use records its exact text (``["env",
NAME]``). A RankValue used as the GPU to run on (``torch.cuda.set_device``, ``torch.device("cuda",
i)``, ``.to(i)``, ``.cuda(i)``) records nothing: every index is the same pretend GPU
(emulator/capture/device.py).

Expressions are JSON lists: ``["rank"]``, ``["local"]``, ``["node"]``, ``["grank", ranks]`` (the
rank's index in a group, -1 outside), ``["coord", ranks, shape, dim]`` (its coordinate in a device
mesh along ``dim``, -1 outside), ``["env", NAME]``, ``["const", value]`` and ``[op, a, b]`` /
``[op, a]`` with an operator of :data:`BINARY` / :data:`UNARY`.
"""

from __future__ import annotations

import operator

BINARY = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul, "floordiv": operator.floordiv,
    "truediv": operator.truediv, "mod": operator.mod, "pow": operator.pow, "and": operator.and_,
    "or": operator.or_, "xor": operator.xor, "lshift": operator.lshift, "rshift": operator.rshift,
    "eq": operator.eq, "ne": operator.ne, "lt": operator.lt, "le": operator.le, "gt": operator.gt,
    "ge": operator.ge, "divmod": lambda a, b: list(divmod(a, b)), "item": lambda a, i: a[i],
}  # fmt: skip
UNARY = {"neg": operator.neg, "pos": operator.pos, "abs": abs, "invert": operator.invert, "bool": bool,
         "int": int, "float": float}  # fmt: skip
ENV = {"RANK": "rank", "LOCAL_RANK": "local", "GROUP_RANK": "node", "NODE_RANK": "node", "ROLE_RANK": "rank"}


class Identity:
    """What a rank is: its global rank, local rank and node (``nproc`` ranks per node)."""

    __slots__ = ("rank", "local", "node")

    def __init__(self, rank: int, nproc: int):
        self.rank, self.local, self.node = rank, rank % nproc, rank // nproc


def evaluate(expr, who: Identity):
    """The value of ``expr`` for the rank ``who``."""
    head = expr[0]
    if head == "rank":
        return who.rank
    if head == "local":
        return who.local
    if head == "node":
        return who.node
    if head == "const":
        return expr[1]
    if head == "env":
        return str(getattr(who, ENV[expr[1]]))
    if head == "grank":
        ranks = expr[1]
        return ranks.index(who.rank) if who.rank in ranks else -1
    if head == "coord":
        ranks, shape, dim = expr[1], expr[2], expr[3]
        if who.rank not in ranks:
            return -1
        flat = ranks.index(who.rank)
        for size in reversed(shape[dim + 1 :]):
            flat //= size
        return flat % shape[dim]
    if head in UNARY:
        return UNARY[head](evaluate(expr[1], who))
    return BINARY[head](evaluate(expr[1], who), evaluate(expr[2], who))


def same_stream(predicates: list, who: Identity) -> bool:
    """Whether every recorded ``[expression, answer]`` gives the same answer for ``who``; an
    expression that fails for it (a division by zero) is an answer that differs."""
    for expr, answer in predicates:
        try:
            value = evaluate(expr, who)
        except (ArithmeticError, ValueError, TypeError, IndexError):
            return False
        if value != answer:  # answers come back from JSON: a divmod pair is a list on both sides
            return False
    return True
