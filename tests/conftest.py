"""Shared fixtures: tiny random models (fast, seeded) and the real default model (loaded once)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from eaglelab.engine.model.config import ModelConfig
from eaglelab.engine.model.gemv import TritonGemv
from eaglelab.engine.model.model import Transformer
from eaglelab.engine.runtime.observer import BaseObserver

TINY = dict(
    architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=96, hidden_size=64,
    intermediate_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
    rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=256, tie_word_embeddings=False,
    bos_token_id=1, eos_token_id=2,
)


class InterpretedGemv(TritonGemv):
    """The Triton GEMV with its device check waived: under Triton's interpreter (TRITON_INTERPRET=1, a test's
    subprocess) the kernel runs on CPU tensors, so the tuner and the compiled op are driven on the CPU."""

    def refusal(self, x, weight):
        why = super().refusal(x, weight)
        return None if why is not None and why.startswith("not CUDA") else why


def tiny_config(**overrides) -> dict:
    d = dict(TINY)
    d.update(overrides)
    return d


def random_model(cfg: dict, seed: int = 0, std: float = 0.2) -> Transformer:
    """A seeded random target; weights large enough that greedy outputs are not degenerate."""
    torch.manual_seed(seed)
    model = Transformer(ModelConfig.from_dict(cfg))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0.0, std)
    model.reset_buffers()
    return model.eval()


def save_hf_dir(model: Transformer, cfg: dict, path: Path) -> Path:
    """Write ``model`` as an HF-format directory (config.json + model.safetensors)."""
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if name == "lm_head.weight" and cfg.get("tie_word_embeddings"):
            continue
        hf = name if name.startswith("lm_head") else "model." + name
        tensors[hf] = p.detach().clone().contiguous()
    save_file(tensors, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(cfg))
    return path


def add_word_tokenizer(model_dir: Path, vocab: int) -> None:
    """A word-level tokenizer (ids = word order: 6 specials, then ``w0``, ``w1``, ...) and a ChatML-like
    template in ``model_dir``, so ``capture`` and ``distill`` can tokenize chats for a tiny target."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["<unk>", "<|im_start|>", "<|im_end|>", "user", "assistant", "system"]
    words += [f"w{i}" for i in range(vocab - len(words))]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    tok.save(str(model_dir / "tokenizer.json"))
    template = ("{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> {% endfor %}"
                "{% if add_generation_prompt %}<|im_start|> assistant {% endif %}")
    (model_dir / "tokenizer_config.json").write_text(json.dumps({"chat_template": template, "eos_token": "<|im_end|>"}))


def capture_tiny(model: Transformer, cfg: dict, root: Path, vocab: int) -> Path:
    """``model`` saved under root/target with a word tokenizer, then ``eaglelab capture`` of 8 prompts (8 new
    tokens, taps at SGLang ids 0, 1, 2, draft vocab 32) into root/data; -> root/data."""
    from eaglelab.cli import main

    save_hf_dir(model, cfg, root / "target")
    add_word_tokenizer(root / "target", vocab)
    assert main(["capture", "--model", str(root / "target"), "--out", str(root / "data"), "--prompts", "8",
                 "--max-new-tokens", "8", "--layer-ids", "0,1,2", "--batch-size", "4", "--device", "cpu",
                 "--dtype", "float32", "--draft-vocab-size", "32"]) == 0
    return root / "data"


def tiny_hf_dir(path: Path) -> Path:
    """The tiny random model (``tiny_config``) as an HF directory with the word tokenizer: a ``--model`` for CLI tests."""
    cfg = tiny_config()
    save_hf_dir(random_model(cfg), cfg, path)
    add_word_tokenizer(path, vocab=cfg["vocab_size"])
    return path


def run_cli(capsys, *argv: str) -> tuple[int, str]:
    """``eaglelab argv...`` in this process: its exit code and what it printed (stdout and stderr, whitespace
    collapsed, so a wrapped line reads as one)."""
    from eaglelab.cli import main

    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, " ".join((out.out + out.err).split())


@pytest.fixture
def tiny_dir(tmp_path) -> Path:
    """:func:`tiny_hf_dir` in the test's temporary directory."""
    return tiny_hf_dir(tmp_path / "tiny")


@pytest.fixture(scope="session")
def default_target():
    """The real SmolLM2-135M-Instruct in float32 (converted from the GGUF on first use)."""
    from eaglelab.engine.formats.loader import load_target

    return load_target("default", device="cpu", dtype=torch.float32)


@pytest.fixture(scope="session")
def mtbench_prompts() -> list[str]:
    from eaglelab.engine.formats.assets import MTBENCH_QUESTIONS, asset_path

    lines = Path(asset_path(MTBENCH_QUESTIONS)).read_text().splitlines()
    return [json.loads(line)["turns"][0] for line in lines if line.strip()]


@pytest.fixture
def one_thread():
    """Tiny ops: one thread avoids thread hand-off costs on a shared 2-core machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def shard_checkpoint(model_dir: Path, shards: int) -> Path:
    """Split ``model_dir``'s single model.safetensors into ``shards`` files plus the index that
    transformers writes (``weight_map``: tensor name -> shard file)."""
    from safetensors.torch import load_file, save_file

    single = model_dir / "model.safetensors"
    tensors = load_file(str(single))
    names = sorted(tensors)
    weight_map = {}
    for k in range(shards):
        part = names[k::shards]
        file = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: tensors[n] for n in part}, str(model_dir / file))
        weight_map |= {n: file for n in part}
    single.unlink()
    (model_dir / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return model_dir


class CycleCollector(BaseObserver):
    """An observer that keeps every cycle's stats, in order."""

    def __init__(self) -> None:
        self.cycles: list = []

    def on_cycle(self, stats) -> None:
        self.cycles.append(stats)


def assert_compiles_and_captures(op, x) -> None:
    """A custom op's call ``op(x)`` (CUDA): compiled whole (fullgraph, static shapes) it gives the eager result
    exactly, and a CUDA graph of the compiled call, replayed over a new input, gives that input's eager result."""
    eager = op(x)
    compiled = torch.compile(lambda a: op(a) * 1, fullgraph=True, dynamic=False)
    torch.testing.assert_close(compiled(x), eager, rtol=0, atol=0)
    graph, static = torch.cuda.CUDAGraph(), x.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        compiled(static)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    with torch.cuda.graph(graph):
        out = compiled(static)
    static.copy_(x * 2)
    graph.replay()
    torch.testing.assert_close(out, op(x * 2), rtol=0, atol=0)


def has_triton() -> bool:
    """Whether Triton is importable (CUDA builds of torch ship it; the CPU CI has none)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def draw_drafter_weights(net, gen: torch.Generator, *, last=lambda name: False):
    """Random weights for an EAGLE-3 network, in place: norms 1 + N(0, 0.3), the rest N(0, 0.2), drawn in one
    order (the names ``last`` picks drawn after the others, so two drafters that differ only by those weights
    share every other one), then a random draft vocabulary of ``draft_vocab_size`` tokens. -> ``net``, eval."""
    V, DV = net.config.vocab_size, net.config.draft_vocab_size
    with torch.no_grad():
        for name, p in sorted(net.named_parameters(), key=lambda kv: last(kv[0])):
            noise = torch.randn(p.shape, generator=gen)
            p.copy_(1.0 + 0.3 * noise if "norm" in name else 0.2 * noise)
        ids = torch.randperm(V, generator=gen)[:DV].sort().values
        net.d2t.copy_(ids - torch.arange(DV))
        net.t2d.zero_()
        net.t2d[ids] = True
    net.reset_buffers()
    return net.eval()
