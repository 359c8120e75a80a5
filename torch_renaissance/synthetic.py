"""Seeded synthetic planning instances shaped like transformer training steps.

The planner's benchmark (``benchmarks/bench_planner.py``) and tests use these
beside the recorded traces in ``../shared/data``, so that the planner is
measured on instances it was not tuned on. Each instance is one training
step of a decoder-only transformer as PyTorch's caching allocator sees it
(sizes rounded up to 512 bytes, one logical tick per allocation or free):

* forward, per micro-batch and layer: activations saved for backward
  (layer-norm inputs, q/k/v, attention probabilities, dropout masks, MLP
  inputs) and short-lived temporaries (matmul outputs, softmax scratch),
  freed soon after they are made;
* backward, layers in reverse: gradients of activations (temporaries), the
  layer's saved activations freed in reverse order of their allocation, and
  weight gradients accumulated into gradient buckets (DDP-style, about
  ``bucket_mb`` MiB each) that live until the optimizer step;
* optimizer: per parameter, a few temporaries (Adam's ``exp_avg_sq.sqrt()``,
  the update), then the buckets are freed (``zero_grad(set_to_none=True)``).

The model's widths, sequence length, batch size and the layer count are drawn
from the seed; ``buffers`` sets about how many buffers the step has (the
micro-batch count is chosen to reach it).

``alternating_step`` makes a cyclic instance instead: two steps of a loop that keeps its
previous output, as the step planner plans it (period 2T, lifetimes that wrap).
"""
from __future__ import annotations

import random
from typing import List, Tuple

_ROUND = 512  # PyTorch's CUDA caching allocator rounds every request to 512 bytes


def _r(n: int) -> int:
    return max(_ROUND, -(-int(n) // _ROUND) * _ROUND)


def training_step(buffers: int = 10_000, seed: int = 0) -> List[Tuple[int, int, int]]:
    """One synthetic training step as ``(size, lower, upper)`` buffers.

    Args:
        buffers: about how many buffers to make (1,000 to 200,000). A step has
            whole layers and micro-batches, so the count comes out within about
            10% of it from 3,000 up, and up to 1.7 times it for small targets.
        seed: picks the model shape, the micro-batch split and the small
            random variations (which temporaries an op makes).

    Returns:
        list of ``(size_bytes, lower, upper)``: lifetime ``[lower, upper)`` in
        a logical clock of one tick per allocation or free; sizes are
        multiples of 512 bytes.

    Raises:
        ValueError: ``buffers`` outside [1,000, 200,000].
    """
    if not 1_000 <= buffers <= 200_000:
        raise ValueError(f"buffers must be in [1000, 200000], got {buffers}")
    rng = random.Random(seed)
    hidden = rng.choice([512, 768, 1024, 1536, 2048, 4096])
    heads = hidden // rng.choice([64, 128])
    ffn = hidden * rng.choice([3, 4])
    seq = rng.choice([128, 256, 512, 1024, 2048])
    batch = rng.choice([1, 2, 4, 8])
    layers = rng.randint(4, 48)
    elem = rng.choice([2, 4])  # bf16 / fp32 activations
    bucket = rng.choice([25, 50]) << 20
    tokens = batch * seq
    per_layer_mb = 29  # about the buffers one layer makes per micro-batch (see below)
    micro = max(1, round(buffers / (layers * per_layer_mb + 20)))
    if micro > 64:  # many buffers: deeper model rather than hundreds of micro-batches
        layers = min(96, max(layers, round(buffers / (64 * per_layer_mb))))
        micro = max(1, round(buffers / (layers * per_layer_mb + 20)))

    out: List[Tuple[int, int, int]] = []
    live = {}  # handle -> (size, lower)
    clock = [0]
    next_id = [0]

    def alloc(size: int) -> int:
        h = next_id[0]
        next_id[0] += 1
        live[h] = (_r(size), clock[0])
        clock[0] += 1
        return h

    def free(h: int) -> None:
        size, lower = live.pop(h)
        out.append((size, lower, clock[0] + 1))
        clock[0] += 1

    act = tokens * hidden * elem
    param_sizes = [hidden * 3 * hidden, hidden * hidden, hidden * ffn, ffn * hidden, hidden, hidden]
    buckets: List[int] = []
    bucket_fill = [bucket]  # bytes left in the newest bucket

    def grad_into_bucket(nbytes: int) -> None:
        if bucket_fill[0] + nbytes > bucket:
            buckets.append(alloc(max(bucket, nbytes)))
            bucket_fill[0] = 0
        bucket_fill[0] += nbytes

    for m in range(micro):
        saved: List[List[int]] = []
        x = alloc(act)  # embedding output
        for _ in range(layers):
            keep = []
            keep.append(alloc(act))                       # layer-norm 1 input
            qkv = alloc(3 * act)
            keep.append(qkv)                              # q, k, v
            scores = alloc(batch * heads * seq * seq * elem)
            probs = alloc(batch * heads * seq * seq * elem)
            free(scores)
            keep.append(probs)                            # attention probabilities
            if rng.random() < 0.7:
                keep.append(alloc(batch * heads * seq * seq))  # dropout mask (bool)
            ctx = alloc(act)
            keep.append(ctx)
            proj = alloc(act)
            nx = alloc(act)                               # residual
            free(proj)
            keep.append(alloc(act))                       # layer-norm 2 input
            up = alloc(tokens * ffn * elem)
            keep.append(up)                               # MLP input of the activation
            g = alloc(tokens * ffn * elem)
            keep.append(g)                                # GELU output
            down = alloc(act)
            nx2 = alloc(act)
            free(down)
            free(x)
            free(nx)
            x = nx2
            for _ in range(rng.randint(0, 3)):            # small scratch (means, rstd, ...)
                free(alloc(tokens * 4 * rng.choice([1, 2])))
            saved.append(keep)
        logits = alloc(tokens * rng.choice([32000, 50304]) * elem // max(1, micro // 4 + 1))
        loss = alloc(4)
        free(logits)
        gx = alloc(act)                                   # gradient of the last activation
        free(x)
        for layer in reversed(range(layers)):
            keep = saved[layer]
            for k in range(len(keep) - 1, -1, -1):
                tmp = alloc(max(act, live[keep[k]][0]))   # gradient of that activation
                free(keep[k])
                if k % 3 == 0:
                    ngx = alloc(act)
                    free(gx)
                    free(tmp)
                    gx = ngx
                else:
                    free(tmp)
            if m == 0:
                for p in param_sizes:
                    grad_into_bucket(p * elem)
            else:
                for _ in range(2):                        # accumulation temporaries
                    free(alloc(param_sizes[rng.randrange(4)] * elem))
        free(gx)
        free(loss)
    for p in range(layers * len(param_sizes)):            # optimizer step
        size = param_sizes[p % len(param_sizes)] * 4
        a = alloc(size)
        b = alloc(size)
        free(a)
        free(b)
    for h in buckets:
        free(h)
    for h in list(live):
        free(h)
    return out


def _check(buffers: int) -> None:
    if not 1_000 <= buffers <= 200_000:
        raise ValueError(f"buffers must be in [1000, 200000], got {buffers}")


def somas_graph(buffers: int = 10_000, seed: int = 0) -> List[Tuple[int, int, int]]:
    """A static compiler graph's tensors as a SOMAS-style planner sees them.

    MindSpore's SOMAS plans every tensor of one compiled training graph, in
    execution order: one tick per op. This generator walks a chain of blocks
    (a residual CNN stage or an encoder layer, drawn per model from the seed):

    * each op's output lives until its last consumer (the next op, or a few
      ops later for a residual branch);
    * about half of the forward outputs are also needed by the op's gradient,
      so they live until that gradient runs (backward visits the ops in
      reverse);
    * ops get workspace buffers that live for the op alone, and tiny
      tensors (shapes, scalars: 4 to 64 bytes) that SOMAS keeps apart from
      the large ones;
    * weight gradients live from their op's gradient to the end (the
      optimizer).

    Sizes are multiples of 32 bytes (SOMAS' alignment) except the tiny ones.

    Args:
        buffers: about how many tensors (1,000 to 200,000; within about 15%).
        seed: picks the model (widths, batch) and the per-op variations.

    Returns:
        list of ``(size_bytes, lower, upper)``, lifetime ``[lower, upper)`` in ticks.

    Raises:
        ValueError: ``buffers`` outside [1,000, 200,000].
    """
    _check(buffers)
    rng = random.Random(seed)
    batch = rng.choice([8, 16, 32, 64])
    width = rng.choice([256, 512, 768, 1024])
    spatial = rng.choice([64, 196, 512, 784])
    elem = rng.choice([2, 4])

    def a32(n: int) -> int:
        return max(32, -(-int(n) // 32) * 32)

    out: List[Tuple[int, int, int]] = []
    ops = []  # forward ops: (tick, output size, saved for backward)
    t = 0
    n_ops = max(8, round(buffers / 3.95))  # about 3.95 tensors an op (see below)
    for k in range(n_ops):
        scale = rng.choice([1, 1, 1, 2, 4, 0.5, 0.25])
        size = a32(batch * spatial * width * elem * scale / rng.choice([1, 1, 2, 4, 8]))
        consumer = t + 1 + (rng.randint(2, 9) if rng.random() < 0.15 else 0)
        saved = rng.random() < 0.5
        ops.append((t, size, saved, consumer))
        if rng.random() < 0.4:
            out.append((a32(size * rng.choice([0.25, 0.5, 1])), t, t + 1))  # workspace
        for _ in range(rng.randint(0, 2)):
            out.append((rng.choice([4, 8, 16, 64]), t, t + rng.randint(1, 3)))  # shapes, scalars
        t += 1
    turn = t
    back_tick = {}
    for k in reversed(range(n_ops)):
        back_tick[k] = t
        t += 1
    end = t + 1
    for k, (tick, size, saved, consumer) in enumerate(ops):
        upper = min(consumer, turn) + 1
        if saved:
            upper = back_tick[k] + 1
        out.append((size, tick, max(upper, tick + 1)))
        bt = back_tick[k]
        out.append((size, bt, bt + 2))  # gradient of the output, consumed by the next grad op
        if rng.random() < 0.3:
            out.append((a32(size * rng.choice([0.5, 1, 2])), bt, bt + 1))  # grad workspace
        if rng.random() < 0.25:
            out.append((a32(width * width * elem * rng.choice([1, 3, 4])), bt, end))  # weight grad
    return out


def xla_buffers(buffers: int = 10_000, seed: int = 0) -> List[Tuple[int, int, int]]:
    """Buffers of an XLA-style partitioned program, shaped like IOPDDL instances.

    The IOPDDL benchmark's memory instances are the buffer live ranges of
    large sharded programs: most buffers are short-lived op outputs (a few
    instructions), a minority live for a long, heavy-tailed time (parameters
    and optimizer slices, activations kept for backward, loop-carried state);
    sizes come from a few dozen distinct tensor shapes, many of them a power
    of two plus a small header, spread over six orders of magnitude.

    Args:
        buffers: how many buffers (1,000 to 200,000).
        seed: picks the shape vocabulary and every draw.

    Returns:
        list of ``(size_bytes, lower, upper)``, lifetime ``[lower, upper)`` in ticks.

    Raises:
        ValueError: ``buffers`` outside [1,000, 200,000].
    """
    _check(buffers)
    rng = random.Random(seed)
    shapes = sorted({(1 << rng.randint(8, 27)) * rng.choice([1, 1, 3, 5]) + rng.choice([0, 0, 1, 64])
                     for _ in range(rng.randint(40, 110))})
    weights = [1.0 / (1 + i) ** 0.7 for i in range(len(shapes))]
    rng.shuffle(weights)
    horizon = int(buffers * rng.uniform(1.2, 1.8))
    out: List[Tuple[int, int, int]] = []
    for _ in range(buffers):
        size = rng.choices(shapes, weights)[0]
        u = rng.random()
        if u < 0.7:
            length = rng.randint(1, 8)
        elif u < 0.93:
            length = int(rng.paretovariate(1.1) * 20)
        else:
            length = int(rng.uniform(0.05, 0.6) * horizon)
        lower = rng.randrange(0, horizon)
        upper = min(horizon, lower + max(1, length))
        out.append((size, lower, upper))
    return out


def alternating_step(buffers: int = 2_000, seed: int = 0) -> Tuple[List[Tuple[int, int, int]], int]:
    """Two training steps of an ordinary loop that keeps its previous output, as one
    cyclic problem: the *alternating* layout the step planner makes (period 2T).

    The loop is ``opt.zero_grad(); out = model(**batch); out.loss.backward(); opt.step()``
    with an HF-style model that returns its logits and a KV-like cache (``past_key_values``,
    two or four tensors per layer) in training too. So each step:

    * frees the previous step's gradients one by one (``zero_grad``);
    * forward, per layer: activations saved for backward, short-lived temporaries, and the
      layer's cache tensors, which ``out`` keeps;
    * the logits, the loss's copy of them and the loss; then ``out = ...`` drops the previous
      step's outputs (logits, loss, cache) one by one, just before the loss's backward (two
      logits-sized gradients, then one of the activations; the step's peak when the
      vocabulary is large beside the attention scores);
    * backward, layers in reverse: activation gradients (temporaries), the saved activations
      freed in reverse, the weight gradients, which live until the next ``zero_grad``;
    * the optimizer's temporaries (two per parameter).

    The outputs live longer than a step (from one forward to just before the next step's
    backward), so the problem is planned over two steps (phase 0 and phase 1, each buffer
    twice), with cyclic lifetimes of period 2T: phase 1's outputs and gradients wrap
    around into phase 0.

    Args:
        buffers: about how many buffers to make over the two steps (200 to 50,000); the
            layer count is chosen to reach it (within about 25%).
        seed: picks the widths, sequence length, batch, vocabulary, cache tensors per layer
            and the small random variations.

    Returns:
        ``(lifetimes, period)``: lifetimes as ``(size_bytes, lower, upper)`` with
        ``0 <= lower < period`` and ``lower < upper <= lower + period`` (``upper > period``
        wraps around); a tick per allocation or free; sizes are multiples of 512 bytes.
        Phase 0's buffers come first, then phase 1's in the same order.

    Raises:
        ValueError: ``buffers`` outside [200, 50,000].
    """
    if not 200 <= buffers <= 50_000:
        raise ValueError(f"buffers must be in [200, 50000], got {buffers}")
    rng = random.Random(seed)
    hidden = rng.choice([128, 256, 384, 512, 768])
    ffn = hidden * rng.choice([2, 4])
    seq = rng.choice([64, 128, 256])
    batch = rng.choice([2, 4, 8])
    vocab = rng.choice([4000, 8000, 16000, 32000])
    cache_per_layer = rng.choice([2, 2, 4])  # decoder k, v (+ cross-attention k, v)
    elem = 4
    tokens = batch * seq
    act = tokens * hidden * elem
    heads = max(1, hidden // 64)
    param_sizes = [hidden * 3 * hidden, hidden * hidden, hidden * ffn, ffn * hidden, hidden, hidden]
    # About the buffers one layer makes in one step (forward, backward, optimizer).
    per_layer = 40 + cache_per_layer
    layers = max(1, round((buffers / 2 - 30) / per_layer))
    # One step's script of events, replayed for both phases: ("a", key, size) or ("f", key).
    script: List[tuple] = []
    kinds = {"grad": [], "out": []}  # keys freed by the next step
    key = [0]

    def alloc(size: int, kind: str = "") -> int:
        k = key[0]
        key[0] += 1
        script.append(("a", k, _r(size)))
        if kind:
            kinds[kind].append(k)
        return k

    def free(k: int) -> None:
        script.append(("f", k))

    script.append(("zero_grad",))
    x = alloc(act)
    saved: List[List[int]] = []
    for _ in range(layers):
        keep = [alloc(act), alloc(3 * act)]
        scores = alloc(batch * heads * seq * seq * elem)
        keep.append(alloc(batch * heads * seq * seq * elem))
        free(scores)
        for _ in range(cache_per_layer):
            alloc(tokens * hidden * elem // rng.choice([1, 2]), "out")
        keep.append(alloc(act))
        nx = alloc(act)
        keep.append(alloc(act))
        keep.append(alloc(tokens * ffn * elem))
        down = alloc(act)
        nx2 = alloc(act)
        free(down)
        free(x)
        free(nx)
        x = nx2
        for _ in range(rng.randint(0, 3)):
            free(alloc(tokens * 4 * rng.choice([1, 2])))
        saved.append(keep)
    big = tokens * vocab * elem
    alloc(big, "out")  # the logits
    shifted = alloc(big)  # the loss's copy of them (shifted labels, float)
    alloc(512, "out")  # the loss
    free(x)
    script.append(("drop_outputs",))
    # The loss's backward: two logits-sized gradients, live together with the logits and
    # their copy; the second needs more than the previous logits' slot.
    g1 = alloc(big)
    g2 = alloc(big)
    free(g1)
    free(shifted)
    gx = alloc(act)
    free(g2)
    for layer in reversed(range(layers)):
        keep = saved[layer]
        for k in range(len(keep) - 1, -1, -1):
            tmp = alloc(act)  # gradient of that activation
            free(keep[k])
            if k % 2 == 0:
                ngx = alloc(act)
                free(gx)
                gx = ngx
            free(tmp)
        for p in param_sizes:
            alloc(p * elem, "grad")
    free(gx)
    for p in range(layers * len(param_sizes)):  # the optimizer's temporaries
        size = param_sizes[p % len(param_sizes)] * elem
        a = alloc(size)
        b = alloc(size)
        free(a)
        free(b)
    ticks_per_step = sum(1 for e in script if e[0] in ("a", "f")) + len(kinds["grad"]) + len(kinds["out"])
    period = 2 * ticks_per_step
    born = {}  # (phase, key) -> (size, tick)
    died = {}  # (phase, key) -> tick
    tick = 0
    for phase in (0, 1):
        other = 1 - phase
        for e in script:
            if e[0] == "a":
                born[(phase, e[1])] = (e[2], tick)
            elif e[0] == "f":
                died[(phase, e[1])] = tick
            else:  # the previous step's gradients, or its outputs, one by one
                for k in kinds["grad" if e[0] == "zero_grad" else "out"]:
                    died[(other, k)] = tick
                    tick += 1
                continue
            tick += 1
    assert tick == period
    out: List[Tuple[int, int, int]] = []
    for phase in (0, 1):
        for k in range(key[0]):
            size, lower = born[(phase, k)]
            end = died.get((phase, k))
            if end is None:
                raise AssertionError("every buffer dies")  # the script frees all it makes
            upper = end + 1 if end >= lower else end + 1 + period
            out.append((size, lower, upper))
    return out, period


def packed_square(buffers: int = 250,
                  seed: int = 0) -> Tuple[List[Tuple[int, int, int]], List[int]]:
    """A hard instance shaped like MiniMalloc's "challenging" set (its A-K).

    Those instances (google/minimalloc, ``benchmarks/challenging``) are a
    square of 1,048,576 ticks by 1,048,576 bytes cut into 150-450 rectangles
    on a 1,024 grid, with some of them taken out (5-12% of the area; their
    LOAD is then at or below the square's side). Every buffer overlaps dozens
    of others, and a plan at the square's side exists by construction, but
    greedy orders end 30-40% above it. This generator cuts the square the
    same way: it splits the rectangle of largest area (ties by the seed)
    across its longer side (in time or in space; three times in ten the
    other one; the first cut in space, so that the instance does not fall
    apart into two time ranges) at a grid point drawn from its middle 60%,
    until there are ``buffers`` plus the removed ones, then removes a seeded
    share of them (5-12% of the rectangles, so about that of the area).

    Args:
        buffers: how many buffers to keep (20 to 2,000).
        seed: picks every cut and which rectangles are removed.

    Returns:
        ``(lifetimes, offsets)``: lifetimes as ``(size_bytes, lower, upper)``
        in ticks 0..1,048,576 (multiples of 1,024), and the generator's own
        layout, an offset in bytes per buffer: a valid plan whose height is at
        most the square's side, 1,048,576 bytes (so the optimum is at most
        that; often it is LOAD itself).

    Raises:
        ValueError: ``buffers`` outside [20, 2,000].
    """
    if not 20 <= buffers <= 2_000:
        raise ValueError(f"buffers must be in [20, 2000], got {buffers}")
    rng = random.Random(seed)
    grid, side = 1024, 1024  # cells of 1,024 ticks x 1,024 bytes; 1,024 cells a side
    removed_share = rng.uniform(0.05, 0.12)
    # Rectangles as (t0, t1, o0, o1) in cells; cut until there are enough
    # that removing removed_share of the area leaves about `buffers`.
    target = int(round(buffers / (1.0 - removed_share)))
    rects = [(0, side, 0, side)]
    first = True
    while len(rects) < target:
        best = max(range(len(rects)),
                   key=lambda i: ((rects[i][1] - rects[i][0]) * (rects[i][3] - rects[i][2]),
                                  rng.random()))
        t0, t1, o0, o1 = rects[best]
        across_time = (t1 - t0) > (o1 - o0) if not first else False
        if rng.random() < 0.3:
            across_time = not across_time and not first
        lo, hi = (t0, t1) if across_time else (o0, o1)
        if hi - lo < 2:
            across_time = not across_time
            lo, hi = (t0, t1) if across_time else (o0, o1)
            if hi - lo < 2:
                break  # nothing left to cut (not reached for buffers <= 2,000)
        cut = rng.randint(lo + max(1, (hi - lo) // 5), hi - max(1, (hi - lo) // 5))
        cut = min(max(cut, lo + 1), hi - 1)
        first = False
        if across_time:
            parts = [(t0, cut, o0, o1), (cut, t1, o0, o1)]
        else:
            parts = [(t0, t1, o0, cut), (t0, t1, cut, o1)]
        rects[best] = parts[0]
        rects.append(parts[1])
    rng.shuffle(rects)
    kept = rects[:buffers]
    out = [((o1 - o0) * grid, t0 * grid, t1 * grid) for t0, t1, o0, o1 in kept]
    return out, [o0 * grid for _, _, o0, _ in kept]
