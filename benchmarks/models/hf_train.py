"""An ordinary training (or generation) loop over third-party models, as a user writes it.

It does not import torch_renaissance: ``bench_models.py`` and ``tests/test_models.py`` run it
with plain ``python`` (PyTorch's allocator) and under ``torch-renaissance run``, and compare.
Models are built from configs with random init (HF transformers; no downloads) or defined
here (a ResNet-style CNN). The loop keeps the previous step's outputs alive across the step
boundary, as ``out = model(**batch)`` does.

    python hf_train.py --arch gpt2 --steps 30 [--seq-range 32 256] [--compile] [--losses out.json]
    python hf_train.py --arch gpt2 --generate 16,64,128 --new-tokens 32
"""
from __future__ import annotations

import argparse
import json

import torch
from torch import nn

ARCHS = ("gpt2", "llama", "bert", "t5", "vit", "cnn", "mlp", "lstm", "gru", "qwen2moe")


class ResNetish(nn.Module):
    """A small ResNet-style CNN (conv-bn-relu blocks with identity shortcuts)."""

    def __init__(self, width: int = 32, blocks: int = 2, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        layers = []
        for i in range(blocks):
            layers.append(nn.Sequential(nn.Conv2d(width, width, 3, padding=1, bias=False), nn.BatchNorm2d(width),
                                        nn.ReLU(), nn.Conv2d(width, width, 3, padding=1, bias=False),
                                        nn.BatchNorm2d(width)))
        self.blocks = nn.ModuleList(layers)
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for b in self.blocks:
            x = torch.relu(x + b(x))
        return self.head(x.mean((2, 3)))


class ManySmall(nn.Module):
    """Many small tensors: a deep stack of narrow residual MLP blocks (every
    activation, weight and gradient well under 1 MiB: PyTorch's small pool)."""

    def __init__(self, width: int = 64, depth: int = 48, classes: int = 10) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(width), nn.Linear(width, 2 * width), nn.GELU(),
                                                  nn.Linear(2 * width, width)) for _ in range(depth))
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = x + b(x)
        return self.head(x)


class RNNLM(nn.Module):
    """A recurrent language model (embedding, 2-layer LSTM or GRU, vocabulary head) whose
    hidden state the loop carries from step to step, detached (truncated backpropagation
    through time): a tensor made in one step and used by the next."""

    def __init__(self, cell: str, vocab: int, d: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.rnn = (nn.LSTM if cell == "lstm" else nn.GRU)(d, d, num_layers=2, batch_first=True)
        self.head = nn.Linear(d, vocab)

    def forward(self, x: torch.Tensor, hidden=None):
        y, hidden = self.rnn(self.emb(x), hidden)
        return self.head(y), hidden


def build(arch: str, size: str, vocab: int) -> nn.Module:
    if arch in ("lstm", "gru"):
        return RNNLM(arch, vocab, 64 if size == "tiny" else 256)
    if arch == "mlp":
        return ManySmall(width=64 if size == "tiny" else 128, depth=24 if size == "tiny" else 48)
    if arch == "cnn":
        return ResNetish(width=32 if size == "tiny" else 64, blocks=2 if size == "tiny" else 4)
    import transformers as T

    tiny = size == "tiny"
    d, layers, heads = (64, 2, 2) if tiny else (256, 4, 4)
    if arch == "gpt2":
        return T.GPT2LMHeadModel(T.GPT2Config(n_layer=layers, n_embd=d, n_head=heads, vocab_size=vocab,
                                              n_positions=256, bos_token_id=0, eos_token_id=0))
    if arch == "llama":
        return T.LlamaForCausalLM(T.LlamaConfig(num_hidden_layers=layers, hidden_size=d, intermediate_size=4 * d,
                                                num_attention_heads=heads, num_key_value_heads=heads,
                                                vocab_size=vocab, max_position_embeddings=256,
                                                bos_token_id=0, eos_token_id=0, pad_token_id=0))
    if arch == "qwen2moe":  # 4 experts, 2 per token (an eager MoE: --experts eager)
        return T.Qwen2MoeForCausalLM(T.Qwen2MoeConfig(
            vocab_size=vocab, hidden_size=d, intermediate_size=2 * d, moe_intermediate_size=d,
            shared_expert_intermediate_size=d, num_hidden_layers=layers, num_attention_heads=heads,
            num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, max_position_embeddings=256,
            output_router_logits=True))
    if arch == "bert":
        return T.BertForMaskedLM(T.BertConfig(num_hidden_layers=layers, hidden_size=d, intermediate_size=4 * d,
                                              num_attention_heads=heads, vocab_size=vocab,
                                              max_position_embeddings=256, pad_token_id=0))
    if arch == "t5":
        return T.T5ForConditionalGeneration(T.T5Config(num_layers=layers, num_decoder_layers=layers, d_model=d,
                                                       d_ff=4 * d, num_heads=heads, d_kv=d // heads,
                                                       vocab_size=vocab, decoder_start_token_id=0,
                                                       pad_token_id=0, eos_token_id=1))
    if arch == "vit":  # 32 x 32 images, patches of 8
        return T.ViTForImageClassification(T.ViTConfig(num_hidden_layers=layers, hidden_size=d,
                                                       intermediate_size=4 * d, num_attention_heads=heads,
                                                       image_size=32, patch_size=8, num_labels=10))
    raise ValueError(f"unknown arch {arch!r}; one of {', '.join(ARCHS)}")


def _step(keyed: bool, key: int):
    """``torch_renaissance.step(key=key)`` when ``keyed`` and installed, else nothing."""
    import contextlib

    if keyed:
        import torch_renaissance as tr

        if tr.installer.is_installed("cpu"):
            return tr.step("cpu", key=key)
    return contextlib.nullcontext()


def train(argv: list = None) -> list:
    """Runs the loop with command-line arguments ``argv``; returns the losses
    (float.hex strings) or the generated tokens."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", choices=ARCHS, default="gpt2")
    p.add_argument("--size", choices=("tiny", "small"), default="small",
                   help="tiny: d=64, 2 layers (tests); small: d=256, 4 layers (benchmarks)")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=128, help="tokens per sequence (CNN: image side)")
    p.add_argument("--seq-range", type=int, nargs=2, metavar=("LO", "HI"),
                   help="draw each step's length from [LO, HI] instead")
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--compile", action="store_true", help="torch.compile the model (inductor)")
    p.add_argument("--generate", metavar="LENGTHS",
                   help="inference instead: generate for prompts of these lengths, e.g. 16,64,128")
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=4, help="--generate: passes over the prompt lengths")
    p.add_argument("--keyed", action="store_true",
                   help="--generate: each generate() is torch_renaissance.step(key=prompt length) "
                        "(imports torch_renaissance; a no-op step where it is not installed)")
    p.add_argument("--bf16", action="store_true", help="run forward under CPU bf16 autocast")
    p.add_argument("--eval-every", type=int, default=0, metavar="N",
                   help="a no_grad eval forward of a fresh batch after every N-th optimizer step (0: none)")
    p.add_argument("--experts", choices=("eager", "grouped_mm"),
                   help="MoE experts implementation (eager: per-expert token counts change every step)")
    p.add_argument("--losses", metavar="PATH", help="write the losses (or generated tokens) as JSON")
    p.add_argument("--threads", type=int, default=0,
                   help="torch.set_num_threads (0: leave as is); 1 makes losses independent of machine load")
    a = p.parse_args(argv)

    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = build(a.arch, a.size, a.vocab)
    if a.experts:
        model.set_experts_implementation(a.experts)
    gen = torch.Generator().manual_seed(1)
    results = []
    if a.generate:
        model.eval()
        lengths = [int(x) for x in a.generate.split(",")]
        with torch.no_grad():
            for _ in range(a.rounds):
                for n in lengths:
                    ids = torch.randint(1, a.vocab, (1, n), generator=gen)
                    with _step(a.keyed, n):
                        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=a.new_tokens,
                                             min_new_tokens=a.new_tokens, do_sample=False)
                    results.append(out[0, n:].tolist())
    else:
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        step_fn = torch.compile(model) if a.compile else model
        hidden = None
        for _ in range(a.steps):
            seq = int(torch.randint(a.seq_range[0], a.seq_range[1] + 1, (1,), generator=gen)) if a.seq_range else a.seq
            if a.arch == "mlp":
                x = torch.randn(a.batch, seq, model.head.in_features,
                                generator=gen)
                y = torch.randint(0, 10, (a.batch, seq), generator=gen)
                out = step_fn(x)
                loss = nn.functional.cross_entropy(out.flatten(0, 1), y.flatten())
            elif a.arch in ("lstm", "gru"):
                x = torch.randint(0, a.vocab, (a.batch, seq), generator=gen)
                out, hidden = step_fn(x, hidden)
                hidden = tuple(h.detach() for h in hidden) if isinstance(hidden, tuple) else hidden.detach()
                loss = nn.functional.cross_entropy(out.flatten(0, 1), x.flatten())
            elif a.arch == "cnn":
                x = torch.randn(a.batch, 3, seq // 2, seq // 2, generator=gen)
                y = torch.randint(0, 10, (a.batch,), generator=gen)
                out = step_fn(x)
                loss = nn.functional.cross_entropy(out, y)
            elif a.arch == "vit":
                x = torch.randn(a.batch, 3, 32, 32, generator=gen)
                y = torch.randint(0, 10, (a.batch,), generator=gen)
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
                    out = step_fn(pixel_values=x, labels=y)
                loss = out.loss
            else:
                ids = torch.randint(1, a.vocab, (a.batch, seq), generator=gen)
                batch = {"input_ids": ids, "labels": ids}
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
                    out = step_fn(**batch)
                loss = out.loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            results.append(loss.item())
            if a.eval_every and len(results) % (a.eval_every + 1) == a.eval_every:
                # A periodic eval inside the loop (its own step structure under run).
                model.eval()
                with torch.no_grad():
                    ids = torch.randint(1, a.vocab, (a.batch, seq), generator=gen)
                    results.append(step_fn(input_ids=ids, labels=ids).loss.item())
                model.train()
        results = [float(x).hex() for x in results]
    if a.losses:
        with open(a.losses, "w") as f:
            json.dump(results, f)
    return results


if __name__ == "__main__":
    print("done", train()[-1])
