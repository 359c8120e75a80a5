"""Model slots: many models on one device, one weight layout per
architecture, switching without allocation.

Tests that need the arena installed for the CPU run in their own process
(``run_python``) and print one JSON line; everything they compare against
(weights, plain-module outputs) is made *before* ``install``, under PyTorch's
default allocator, so the arena's numbers count only what ModelSlots and the
forwards use. The others run here, without the arena.
"""
from __future__ import annotations

import math
import textwrap

import pytest
import torch
from torch import nn

from conftest import run_json
from torch_renaissance import ModelSlots
from torch_renaissance.examples import serving as S

ALIGN = 256


@pytest.fixture(autouse=True)
def one_thread():
    # Small models: one intra-op thread is as fast, and on a loaded CI machine
    # OpenMP threads spin-waiting for a core would dominate the run time.
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def slot_set_bytes(module: nn.Module) -> int:
    """Bytes of one slot set, computed here: every unique parameter and buffer
    padded to 256 bytes, in order."""
    seen, total = set(), 0
    for t in list(module.parameters()) + list(module.buffers()):
        if id(t) in seen:
            continue
        seen.add(id(t))
        total += math.ceil(t.numel() * t.element_size() / ALIGN) * ALIGN
    return total


def plain_output(arch: str, state: dict, inputs: tuple) -> torch.Tensor:
    m = S.ARCHITECTURES[arch]()
    m.load_state_dict(state)
    m.eval()
    with torch.no_grad():
        return m(*inputs)


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    # Equal up to float rounding (BLAS kernels may take other paths for other
    # alignments); different models differ by far more than this.
    return a.shape == b.shape and torch.allclose(a, b, rtol=1e-6, atol=1e-6)


def registered(capacity_bytes=None, evict=True, archs=tuple(S.ARCHITECTURES)) -> ModelSlots:
    slots = ModelSlots("cpu", capacity_bytes=capacity_bytes, evict=evict)
    for a in archs:
        torch.manual_seed(0)
        slots.register(a, S.ARCHITECTURES[a], S.example_inputs(a))
    return slots


# --- in this process (no arena) --------------------------------------------------


def test_register_returns_the_layout_with_exact_byte_counts():
    slots = ModelSlots("cpu")
    for a in S.ARCHITECTURES:
        torch.manual_seed(0)
        ref = S.ARCHITECTURES[a]()
        layout = slots.register(a, S.ARCHITECTURES[a], S.example_inputs(a))
        assert layout.weight_bytes == slot_set_bytes(ref)
        assert layout.tensor_bytes == sum(t.numel() * t.element_size()
                                          for t in list(ref.parameters()) + list(ref.buffers()))
        assert layout.keys == tuple(ref.state_dict())
        assert layout.activation_bytes is None  # no arena plans steps here
        slot_offsets = [s.offset for s in layout.plan.region("weights")]
        assert all(o % ALIGN == 0 for o in slot_offsets)
    # The MoE's router_scale is a non-persistent buffer: a slot, not a key.
    moe = slots.layout("moe")
    assert "moe.router_scale" in moe.plan.region("weights")
    assert "moe.router_scale" not in moe.keys
    st = slots.stats()
    assert st["held_bytes"] == sum(slot_set_bytes(S.ARCHITECTURES[a]()) for a in S.ARCHITECTURES)
    assert st["in_use_bytes"] == 0


def test_outputs_equal_plain_modules_without_the_arena():
    slots = registered()
    gen = torch.Generator().manual_seed(3)
    weights = {f"{a}{j}": S.make_weights(a, 10 * i + j) for i, a in enumerate(S.ARCHITECTURES)
               for j in range(2)}
    for name, w in weights.items():
        slots.load(name, name[:3], w)
    for name, w in weights.items():
        x = S.example_inputs(name[:3], gen)
        assert same(slots.forward(name, *x), plain_output(name[:3], w, x)), name
        module = slots.get(name)
        assert same(module(*x), plain_output(name[:3], w, x)), name


def test_parameters_are_views_into_the_slot_set():
    slots = registered(archs=("mlp",))
    slots.load("a", "mlp", S.make_weights("mlp", 1))
    base = slots.slot_set_address("a")
    plan = slots.layout("mlp").plan
    module = slots.get("a")
    for name, t in list(module.named_parameters()) + list(module.named_buffers()):
        start, _ = plan.slot_range("weights", name)
        assert t.data_ptr() == base + start, name
        assert not t.requires_grad


@pytest.mark.parametrize("op", ["load", "swap"])
@pytest.mark.parametrize("bad", ["missing", "extra", "shape", "dtype", "sparse", "meta"])
def test_bad_weights_raise_naming_the_key_and_nothing_is_lost(op, bad):
    slots = registered(archs=("mlp", "gnn"))
    good = S.make_weights("mlp", 1)
    other = S.make_weights("gnn", 2)
    slots.load("m", "mlp", good)
    slots.load("g", "gnn", other)
    x, xg = S.example_inputs("mlp"), S.example_inputs("gnn")
    before = {n: slots.get(n).state_dict() for n in ("m", "g")}
    before = {n: {k: v.clone() for k, v in sd.items()} for n, sd in before.items()}
    addresses = {n: slots.slot_set_address(n) for n in ("m", "g")}
    held = slots.held_bytes

    w = dict(S.make_weights("mlp", 7))
    if bad == "missing":
        del w["body.1.running_var"]
        key, expect = "body.1.running_var", "float32 of shape (512,)"
    elif bad == "extra":
        w["body.9.weight"] = torch.zeros(3)
        key, expect = "body.9.weight", "unexpected key"
    elif bad == "shape":
        w["head.weight"] = torch.zeros(16, 511)
        key, expect = "head.weight", "expected float32 of shape (16, 512)"
    elif bad == "dtype":
        w["body.0.bias"] = w["body.0.bias"].double()
        key, expect = "body.0.bias", "expected float32 of shape (512,)"
    elif bad == "sparse":
        # Shape and dtype match; copy_() from it fails. Found by a tester: the first
        # tensors were already copied, leaving the model half-swapped.
        w["head.bias"] = w["head.bias"].to_sparse()
        key, expect = "head.bias", "a sparse_coo tensor, expected a dense float32 of shape (16,)"
    else:
        w["head.bias"] = torch.empty_like(w["head.bias"], device="meta")
        key, expect = "head.bias", "a meta tensor (no data), expected a dense float32"
    with pytest.raises(ValueError) as err:
        if op == "load":
            slots.load("new", "mlp", w)
        else:
            slots.swap("m", w)
    msg = str(err.value)
    assert repr(key) in msg and expect in msg, msg
    # Nothing copied, nothing lost: same models, same bytes, same addresses.
    assert "new" not in slots and slots.models() == {"m": "loaded", "g": "loaded"}
    assert slots.held_bytes == held
    for n in ("m", "g"):
        assert slots.slot_set_address(n) == addresses[n]
        now = slots.get(n).state_dict()
        assert all(torch.equal(now[k], v) for k, v in before[n].items()), n
    assert same(slots.forward("m", *x), plain_output("mlp", good, x))
    assert same(slots.forward("g", *xg), plain_output("gnn", other, xg))


def test_clear_errors_for_unknown_names_and_duplicates():
    slots = registered(archs=("mlp",))
    w = S.make_weights("mlp", 1)
    with pytest.raises(KeyError, match="architecture 'nope' is not registered"):
        slots.load("a", "nope", w)
    with pytest.raises(KeyError, match="unknown model 'ghost'"):
        slots.unload("ghost")
    with pytest.raises(KeyError, match="unknown model 'ghost'"):
        slots.get("ghost")
    with pytest.raises(KeyError, match="unknown model 'ghost'"):
        slots.swap("ghost", w)
    slots.load("a", "mlp", w)
    with pytest.raises(ValueError, match="'a' is already loaded"):
        slots.load("a", "mlp", w)
    slots.offload("a")
    with pytest.raises(ValueError, match="'a' is already offloaded"):
        slots.load("a", "mlp", w)
    with pytest.raises(ValueError, match="already registered"):
        slots.register("mlp", S.ARCHITECTURES["mlp"], S.example_inputs("mlp"))
    with pytest.raises(TypeError, match="state_dict"):
        slots.swap("a", [1, 2])
    assert slots.models() == {"a": "offloaded"}


def test_capacity_exceeded_without_eviction_is_an_oom_naming_arch_and_bytes():
    mlp = slot_set_bytes(S.ARCHITECTURES["mlp"]())
    gnn = slot_set_bytes(S.ARCHITECTURES["gnn"]())
    cap = 2 * mlp + gnn + 1000
    slots = registered(capacity_bytes=cap, evict=False, archs=("mlp", "gnn"))
    w = {i: S.make_weights("mlp", i) for i in range(3)}
    slots.load("a", "mlp", w[0])
    slots.load("b", "mlp", w[1])
    slots.load("g", "gnn", S.make_weights("gnn", 5))
    with pytest.raises(torch.OutOfMemoryError) as err:
        slots.load("c", "mlp", w[2])
    msg = str(err.value)
    free = cap - 2 * mlp - gnn
    assert "'mlp'" in msg and f"needs {mlp} bytes" in msg and f"{free} bytes are free" in msg, msg
    assert slots.models() == {"a": "loaded", "b": "loaded", "g": "loaded"}
    x = S.example_inputs("mlp")
    assert same(slots.forward("a", *x), plain_output("mlp", w[0], x))
    assert same(slots.forward("b", *x), plain_output("mlp", w[1], x))
    # Room made by the caller: the free slot set is taken, no new one.
    slots.unload("a")
    slots.load("c", "mlp", w[2])
    assert slots.held_bytes == 2 * mlp + gnn


def test_lru_eviction_offloads_the_least_recently_used_and_get_brings_it_back():
    mlp = slot_set_bytes(S.ARCHITECTURES["mlp"]())
    moe = slot_set_bytes(S.ARCHITECTURES["moe"]())
    slots = registered(capacity_bytes=2 * mlp + moe, archs=("mlp", "moe"))
    w = {i: S.make_weights("mlp", i) for i in range(3)}
    wm = S.make_weights("moe", 9)
    x, xm = S.example_inputs("mlp"), S.example_inputs("moe")
    slots.load("a", "mlp", w[0])
    slots.load("b", "mlp", w[1])
    slots.load("e", "moe", wm)
    slots.forward("a", *x)                       # b is now the least recently used
    slots.load("c", "mlp", w[2])                 # evicts b (same architecture)
    assert slots.models() == {"a": "loaded", "b": "offloaded", "e": "loaded", "c": "loaded"}
    st = slots.stats()
    assert st["models"]["b"]["evictions"] == 1 and st["architectures"]["mlp"]["evictions"] == 1
    assert st["held_bytes"] == 2 * mlp + moe
    # Reloading b needs an mlp slot set: e (least recent) is evicted and its
    # moe slot set released, which is not room enough (mlp > moe), so a is
    # evicted too and b takes its slot set.
    out = slots.forward("b", *x)
    assert same(out, plain_output("mlp", w[1], x))
    assert slots.models() == {"a": "offloaded", "b": "loaded", "e": "offloaded", "c": "loaded"}
    assert slots.held_bytes == 2 * mlp
    assert same(slots.forward("e", *xm), plain_output("moe", wm, xm))  # and back again
    for i, n in enumerate("abc"):
        if slots.models()[n] == "loaded":
            assert same(slots.forward(n, *x), plain_output("mlp", w[i], x))
    assert slots.held_bytes <= 2 * mlp + moe


def test_offload_returns_the_slot_set_for_reuse_and_get_reloads():
    slots = registered(archs=("gnn",))
    w1, w2 = S.make_weights("gnn", 1), S.make_weights("gnn", 2)
    x = S.example_inputs("gnn")
    slots.load("a", "gnn", w1)
    addr = slots.slot_set_address("a")
    held = slots.held_bytes
    assert slots.offload() == ["a"]
    assert slots.models() == {"a": "offloaded"} and slots.slot_set_address("a") is None
    assert slots.held_bytes == held              # kept on the free list, not handed back
    slots.load("b", "gnn", w2)                   # takes the freed slot set
    assert slots.slot_set_address("b") == addr
    assert same(slots.forward("a", *x), plain_output("gnn", w1, x))  # reloaded elsewhere
    assert same(slots.forward("b", *x), plain_output("gnn", w2, x))
    slots.swap("a", w2)                          # swap into an offloaded model's host copy
    slots.offload("a")
    slots.swap("a", w1)
    assert same(slots.forward("a", *x), plain_output("gnn", w1, x))
    st = slots.stats()["models"]["a"]
    assert (st["offloads"], st["reloads"], st["swaps"]) == (2, 2, 2)
    assert slots.release_free() == 0             # nothing free: both are loaded
    slots.unload("b")
    assert slots.release_free("gnn") == slots.layout("gnn").weight_bytes


def test_tied_weights_share_one_slot_and_modules_are_accepted_as_weights():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(50, 16)
            self.out = nn.Linear(16, 50, bias=False)
            self.out.weight = self.emb.weight

        def forward(self, idx):
            return self.out(self.emb(idx))

    slots = ModelSlots("cpu")
    layout = slots.register("tied", Tied, (torch.arange(8),))
    assert [s.name for s in layout.plan.region("weights")] == ["emb.weight"]
    assert layout.weight_bytes == math.ceil(50 * 16 * 4 / ALIGN) * ALIGN
    torch.manual_seed(4)
    src = Tied().eval()
    module = slots.load("t", "tied", src)
    assert module.out.weight is module.emb.weight
    idx = torch.tensor([1, 5, 7])
    with torch.no_grad():
        assert same(slots.forward("t", idx), src(idx))


# --- with the arena installed (one process each) ----------------------------------


PRELUDE = textwrap.dedent("""
    import json, random, sys, torch
    from torch_renaissance.examples import serving as S

    torch.set_num_threads(1)  # see one_thread()

    ARCH = list(S.ARCHITECTURES)
    X = {a: S.example_inputs(a) for a in ARCH}

    def plain(arch, state, inputs):
        m = S.ARCHITECTURES[arch]()
        m.load_state_dict(state)
        m.eval()
        with torch.no_grad():
            return m(*inputs)

    def same(a, b):
        return a.shape == b.shape and torch.allclose(a, b, rtol=1e-6, atol=1e-6)

    def stat(*keys):
        s = tr.memory_stats()
        return [s[k] for k in keys]
""")


def run_scenario(body: str) -> dict:
    return run_json(PRELUDE + textwrap.dedent(body), timeout=300)


LIFECYCLE = """
    # 3 mlp, 2 gnn, 4 moe models, two weight versions each; references first.
    COUNT = {"mlp": 3, "gnn": 2, "moe": 4}
    W = {f"{a}{j}": [S.make_weights(a, 100 * i + 10 * j + v) for v in range(2)]
         for i, a in enumerate(ARCH) for j in range(COUNT[a])}
    REF = {(n, v): plain(n[:3], W[n][v], X[n[:3]]) for n in W for v in range(2)}

    import torch_renaissance as tr
    tr.install("cpu")
    slots = tr.ModelSlots("cpu")
    for a in ARCH:
        torch.manual_seed(0)
        slots.register(a, S.ARCHITECTURES[a], X[a])
    version = {}
    failures, planned = [], []

    def check(phase):
        for n, v in version.items():
            y = slots.forward(n, *X[n[:3]])
            hits, allocs = stat("renaissance.last_step_hits", "renaissance.last_step_allocations")
            planned.append(hits == allocs)
            if not same(y, REF[(n, v)]):
                failures.append((phase, n))
            del y

    for n in W:
        slots.load(n, n[:3], W[n][0]); version[n] = 0
    check("all loaded")
    slots.unload("mlp1"); del version["mlp1"]
    check("mlp1 unloaded")
    slots.load("mlp1", "mlp", W["mlp1"][1]); version["mlp1"] = 1
    slots.swap("gnn0", W["gnn0"][1]); version["gnn0"] = 1
    slots.swap("moe3", W["moe3"][1]); version["moe3"] = 1
    check("loaded, swapped")
    slots.offload("moe1"); slots.offload("gnn1")
    check("two offloaded")        # forward() reloads them
    slots.offload()
    slots.swap("mlp2", W["mlp2"][1]); version["mlp2"] = 1   # into the host copy
    check("all offloaded")
    print(json.dumps({"failures": failures, "planned": planned,
                      "states": slots.models(), "stats": slots.stats()["architectures"]}))
"""


def test_outputs_equal_plain_modules_through_load_unload_swap_offload():
    out = run_scenario(LIFECYCLE)
    assert out["failures"] == []
    assert len(out["planned"]) == 9 + 8 + 9 + 9 + 9
    # Every forward replays its architecture's plan, whichever ran before it.
    assert all(out["planned"]), out["planned"]
    assert set(out["states"].values()) == {"loaded"}
    for a, st in out["stats"].items():
        assert st["activation_bytes"] >= st["activation_load_bytes"] > 0, (a, st)


RANDOM_OPS = """
    NAMES = [f"{a}{j}" for a in ARCH for j in range(4)]
    W = {n: [S.make_weights(n[:3], 1000 * ARCH.index(n[:3]) + 10 * int(n[3:]) + v)
             for v in range(2)] for n in NAMES}
    REF = {(n, v): plain(n[:3], W[n][v], X[n[:3]]) for n in NAMES for v in range(2)}
    SLOT = {}
    for a in ARCH:  # slot set bytes, computed here
        m = S.ARCHITECTURES[a]()
        SLOT[a] = sum(-(-t.numel() * t.element_size() // 256) * 256
                      for t in list(m.parameters()) + list(m.buffers()))

    import torch_renaissance as tr
    tr.install("cpu")
    slots = tr.ModelSlots("cpu")
    act = {}
    for a in ARCH:
        torch.manual_seed(0)
        act[a] = slots.register(a, S.ARCHITECTURES[a], X[a]).activation_bytes
    tr.empty_cache()  # what registering left cached (its recorded steps)

    rng = random.Random(1234)
    loaded, sets = {}, {a: 1 for a in ARCH}   # register made one slot set each
    rows, failures = [], []
    for i in range(1000):
        free = [n for n in NAMES if n not in loaded]
        op = rng.choice((["load"] if free else []) + (["unload", "swap"] if loaded else []))
        allocs0, = stat("allocation.all.allocated")
        if op == "load":
            n = rng.choice(free); v = rng.randrange(2)
            slots.load(n, n[:3], W[n][v]); loaded[n] = v
        elif op == "unload":
            n = rng.choice(sorted(loaded)); slots.unload(n); del loaded[n]
        else:
            n = rng.choice(sorted(loaded)); loaded[n] ^= 1; slots.swap(n, W[n][loaded[n]])
        made = {}
        for a in ARCH:
            k = sum(1 for m in loaded if m[:3] == a)
            if k > sets[a]:
                made[a] = k - sets[a]; sets[a] = k
        allocs1, reserved = stat("allocation.all.allocated", "reserved_bytes.all.current")
        if i % 20 == 0 and loaded:
            n = rng.choice(sorted(loaded))
            y = slots.forward(n, *X[n[:3]])
            if not same(y, REF[(n, loaded[n])]):
                failures.append((i, n))
            del y
            reserved = max(reserved, *stat("reserved_bytes.all.current"))
        rows.append({"op": op, "made": sum(SLOT[a] * k for a, k in made.items()),
                     "made_sets": sum(made.values()), "allocs": allocs1 - allocs0,
                     "reserved": reserved,
                     "bound": sum(SLOT[a] * sets[a] + act[a] for a in ARCH),
                     "held": slots.held_bytes, "held_expected": sum(SLOT[a] * sets[a] for a in ARCH)})
    print(json.dumps({"rows": rows, "failures": failures, "act": act}))
"""


def test_1000_random_ops_reserved_within_slot_sets_plus_activation_plans():
    out = run_scenario(RANDOM_OPS)
    rows = out["rows"]
    assert out["failures"] == []
    assert all(v and v > 0 for v in out["act"].values()), out["act"]
    assert {r["op"] for r in rows} == {"load", "unload", "swap"}
    last_growth = 0
    for i, r in enumerate(rows):
        # Slot sets are made only when an architecture has more models loaded
        # than ever before; each is one allocation, and nothing else allocates.
        assert r["held"] == r["held_expected"], (i, r)
        assert r["allocs"] == r["made_sets"], (i, r)
        # Reserved: at most the slot sets held plus one activation plan per
        # architecture, ...
        assert r["reserved"] <= r["bound"], (i, r)
        # ... and it grows only when a slot set is made, by at most its bytes
        # rounded up to the arena's segment growth (64 KiB on the CPU).
        if i:
            grew = r["reserved"] - rows[i - 1]["reserved"]
            if r["made"] == 0:
                assert grew <= 0, (i, r, rows[i - 1])
            else:
                assert grew <= r["made"] + r["made_sets"] * 65536, (i, r)
                last_growth = i
    # After every architecture reached its largest number of loaded models,
    # nothing grows: the rest of the sequence reuses slot sets.
    assert last_growth < 200 and rows[-1]["reserved"] == max(r["reserved"] for r in rows)


SWITCH = """
    W = {a: [S.make_weights(a, 50 * i + v) for v in range(3)] for i, a in enumerate(ARCH)}
    REF = {(a, v): plain(a, W[a][v], X[a]) for a in ARCH for v in range(3)}
    import torch_renaissance as tr
    tr.install("cpu")
    slots = tr.ModelSlots("cpu")
    for a in ARCH:
        torch.manual_seed(0)
        slots.register(a, S.ARCHITECTURES[a], X[a])
    res = {}
    for a in ARCH:
        slots.load(a + "-0", a, W[a][0])          # the first load of the architecture
        ok0 = same(slots.forward(a + "-0", *X[a]), REF[(a, 0)])
        module = slots.get(a + "-0")
        ptrs = [t.data_ptr() for t in list(module.parameters()) + list(module.buffers())]
        slots.unload(a + "-0")
        n0, = stat("allocation.all.allocated")
        m = slots.load(a + "-1", a, W[a][1])      # switch: another model of it
        n1, = stat("allocation.all.allocated")
        slots.swap(a + "-1", W[a][2])             # new version, same addresses
        n2, = stat("allocation.all.allocated")
        ptrs2 = [t.data_ptr() for t in list(m.parameters()) + list(m.buffers())]
        ok2 = same(slots.forward(a + "-1", *X[a]), REF[(a, 2)])
        res[a] = {"load_allocs": n1 - n0, "swap_allocs": n2 - n1, "same_addresses": ptrs == ptrs2,
                  "same_module": m is module, "outputs": [ok0, ok2],
                  "stats": slots.stats()["models"][a + "-1"]}
    print(json.dumps(res))
"""


def test_switch_and_swap_allocate_nothing_and_keep_every_address():
    res = run_scenario(SWITCH)
    for a, r in res.items():
        assert r["load_allocs"] == 0 and r["swap_allocs"] == 0, (a, r)
        assert r["same_addresses"] and r["same_module"], (a, r)
        assert r["outputs"] == [True, True], (a, r)
        st = r["stats"]
        assert st["loads"] == 1 and st["swaps"] == 1 and st["switches"] == 2
        assert st["mean_switch_seconds"] > 0


def test_old_import_paths_name_the_package_classes():
    # model_slots.py became the model_slots/ package: the old module path and
    # its public names still work and are the same objects.
    import torch_renaissance as tr
    import torch_renaissance.model_slots as ms
    from torch_renaissance.model_slots.records import ArchitectureLayout
    from torch_renaissance.model_slots.slots import ModelSlots as Facade

    assert ms.ModelSlots is tr.ModelSlots is Facade
    assert ms.ArchitectureLayout is ArchitectureLayout
    assert ms.REGION == "weights"
    assert ms.__all__ == ["ArchitectureLayout", "ModelSlots", "REGION", "Weights"]
