"""Installing the CPU allocator into PyTorch, configuration, end-to-end training
and `torch-renaissance run`. Installs are per process: each test that
installs runs in a subprocess."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from conftest import clean_env, run_python

from torch_renaissance.allocator import Config, make_config, parse_conf


def test_parse_conf_values():
    assert parse_conf("max_reserved_mb:4096, stream_policy:wait,planning:False") == {
        "max_reserved_mb": 4096, "stream_policy": "wait", "planning": False}
    assert parse_conf("") == {}
    assert parse_conf("max_variants:0x10") == {"max_variants": 16}


@pytest.mark.parametrize("text, needle", [
    ("max_reserved_mb", "not key:value"),
    ("no_such_key:1", "unknown config key 'no_such_key'"),
    ("max_reserved_mb:lots", "bad value 'lots' for config key 'max_reserved_mb'"),
    ("max_reserved_mb:-5", "bad value '-5'"),
    ("stream_policy:eager", "bad value 'eager' for config key 'stream_policy'"),
    ("planning:maybe", "bad value 'maybe' for config key 'planning'"),
    ("max_variants:0", "bad value '0' for config key 'max_variants'"),
    # A no-break space (pasted from a web page) is not whitespace to the parser, in keys and
    # values alike, and the message shows it rather than printing what looks like a space.
    ("planning:false,\xa0max_variants:4", r"unknown config key '\\xa0max_variants'"),
    ("planning:\xa0false", r"bad value '\\xa0false' for config key 'planning'"),
    ("stream_policy:wait\xa0", r"bad value 'wait\\xa0' for config key 'stream_policy'"),
])
def test_parse_conf_errors_name_the_problem(text, needle):
    with pytest.raises(ValueError, match=needle):
        parse_conf(text)


def test_make_config_env_and_overrides(monkeypatch):
    monkeypatch.setenv("TORCH_RENAISSANCE_CONF", "max_reserved_mb:4096,planning:false")
    cfg = make_config()
    assert cfg == Config(max_reserved_bytes=4096 << 20, planning=False)
    cfg = make_config(max_reserved_mb=1, stream_policy="wait")
    assert cfg.max_reserved_bytes == 1 << 20 and cfg.stream_policy == "wait" and not cfg.planning


def test_install_twice_same_config_warns_different_raises():
    r = run_python(textwrap.dedent("""
        import warnings, torch, torch_renaissance as tr
        tr.install("cpu", max_reserved_mb=512)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            tr.install("cpu", max_reserved_mb=512)
        assert any("already installed" in str(x.message) for x in w), w
        try:
            tr.install("cpu", max_reserved_mb=256)
        except RuntimeError as e:
            assert "different configuration" in str(e) and "max_reserved_bytes" in str(e), e
            print("OK")
    """))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "OK"


def test_env_config_and_tensors_before_install_keep_their_deleter():
    r = run_python(textwrap.dedent("""
        import torch, torch_renaissance as tr
        before = torch.ones(1 << 16)              # default allocator
        tr.install("cpu")
        cfg = tr.installed_config("cpu")
        assert cfg.max_reserved_bytes == 96 << 20 and cfg.stream_policy == "wait", cfg
        after = torch.ones(1 << 16)               # ours
        s0 = tr.memory_allocated()
        assert s0 >= after.numel() * 4, s0
        del before                                # frees through the default deleter
        assert tr.memory_allocated() == s0
        del after
        assert tr.memory_allocated() == s0 - (1 << 18)
        print("OK")
    """), env={"TORCH_RENAISSANCE_CONF": "max_reserved_mb:96,stream_policy:wait"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "OK"


def test_torch_oom_is_raised_and_counted():
    r = run_python(textwrap.dedent("""
        import torch, torch_renaissance as tr
        tr.install("cpu", max_reserved_mb=64)
        try:
            torch.empty(100 << 20, dtype=torch.uint8)
        except torch.OutOfMemoryError as e:
            assert "100.00 MiB" in str(e) and "max_reserved_bytes" in str(e), e
        else:
            raise SystemExit("no OOM")
        assert tr.memory_stats()["num_ooms"] == 1
        x = torch.ones(1 << 20)                   # the arena is still usable
        assert float(x.sum()) == float(1 << 20)
        print("OK")
    """))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "OK"


TRAIN = textwrap.dedent("""
    import json, sys, torch
    mode = sys.argv[1]
    import torch_renaissance as tr
    if mode != "default":
        tr.install("cpu", planning=(mode == "planned"))
    from torch_renaissance.examples import gpt
    cfg = gpt.GPTConfig()                  # the demo's model, as `torch-renaissance demo` trains it
    model, opt = gpt.make(cfg, seed=0)
    gen = torch.Generator().manual_seed(1)
    losses = []
    for i in range(int(sys.argv[2])):
        x, y = gpt.synthetic_batch(gen, 4, cfg.seq_len, cfg.vocab_size)
        if mode == "planned":
            with tr.step():
                losses.append(gpt.train_step(model, opt, x, y))
        else:
            losses.append(gpt.train_step(model, opt, x, y))
    out = {"losses": [float(l).hex() for l in losses]}
    if mode != "default":
        out["stats"] = dict(tr.memory_stats())
    print(json.dumps(out))
""")


# One intra-op thread in the bit-identity runs: the comparison is across
# allocators, and a matmul's summation order must not change with how the
# threads were scheduled (CI saw one run differ at step 2 by an ulp, on a
# 2-core machine with two OpenMP threads each).
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _train(mode: str, steps: int) -> dict:
    r = run_python(TRAIN, mode, str(steps), env=ONE_THREAD)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_gpt_trains_bit_identical_under_our_allocator():
    default = _train("default", 20)
    ours = _train("dynamic", 20)
    planned = _train("planned", 20)
    assert ours["losses"] == default["losses"]
    assert planned["losses"] == default["losses"]
    assert planned["stats"]["renaissance.planned_steps"] == 18
    s = ours["stats"]
    assert s["allocation.all.allocated"] > 20 * 100  # every step allocates
    assert s["allocated_bytes.all.peak"] > 0 and s["reserved_bytes.all.peak"] >= s["allocated_bytes.all.peak"]
    assert s["num_ooms"] == 0


SCRIPT = textwrap.dedent("""
    import json, sys, torch
    import torch_renaissance as tr
    print("script args:", sys.argv[1:])
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(5):
        opt.zero_grad()
        model(torch.randn(32, 64)).square().mean().backward()
        opt.step()
    with open(sys.argv[1], "w") as f:
        json.dump(dict(tr.memory_stats()), f)
    sys.exit(3)
""")


def test_run_cli_passes_output_and_exit_code_through(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    stats_path, report_path = tmp_path / "stats.json", tmp_path / "report.json"
    r = subprocess.run([sys.executable, "-m", "torch_renaissance.cli", "run", "--report", str(report_path),
                        str(script), str(stats_path)], capture_output=True, text=True, env=clean_env(),
                       cwd=str(tmp_path), timeout=300)
    assert r.returncode == 3, r.stderr
    assert r.stdout.strip() == f"script args: ['{stats_path}']"
    assert "torch_renaissance memory report" in r.stderr
    stats = json.loads(stats_path.read_text())
    rep = json.loads(report_path.read_text())
    # The report is taken after the script ended: peaks cannot have moved.
    assert rep["peak_allocated_bytes"] == stats["allocated_bytes.all.peak"]
    assert rep["peak_reserved_bytes"] == stats["reserved_bytes.all.peak"]
    assert rep["allocations"] >= stats["allocation.all.allocated"]
    assert rep["steps"] == 5
    assert rep["fragmentation"] == pytest.approx(1 - rep["peak_allocated_bytes"] / rep["peak_reserved_bytes"])


def test_demo_prints_side_by_side_and_writes_json(tmp_path):
    out = tmp_path / "demo.json"
    r = subprocess.run([sys.executable, "-m", "torch_renaissance.cli", "demo", "--steps", "4", "--batch", "2",
                        "--seq", "32", "--json", str(out)], capture_output=True, text=True,
                       env=clean_env(), timeout=600)
    assert r.returncode == 0, r.stderr
    assert "losses bit-identical across allocators: yes" in r.stdout
    data = json.loads(out.read_text())
    assert list(data) == ["PyTorch default", "renaissance dynamic", "renaissance planned"]
    for title, row in data.items():
        assert title in r.stdout
        for key in ("mean step time (ms)", "peak RSS (MiB)", "peak reserved (MiB)", "final loss"):
            assert key in row and key in r.stdout
    assert data["PyTorch default"]["peak reserved (MiB)"] is None  # PyTorch's CPU allocator has no stats
    assert data["renaissance dynamic"]["peak reserved (MiB)"] > 0
    assert data["renaissance planned"]["losses"] == data["PyTorch default"]["losses"]


def test_keyword_limit_replaces_the_environment_limit_in_either_unit(monkeypatch):
    monkeypatch.setenv("TORCH_RENAISSANCE_CONF", "max_reserved_bytes:1048576")
    assert make_config(max_reserved_mb=4096).max_reserved_bytes == 4096 << 20
    monkeypatch.setenv("TORCH_RENAISSANCE_CONF", "max_reserved_mb:1")
    assert make_config(max_reserved_bytes=12345).max_reserved_bytes == 12345
