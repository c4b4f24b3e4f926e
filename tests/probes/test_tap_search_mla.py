"""check-wiring's data-free tap search (``--search``, in memory and ``--stream``) on the MLA drafter layout
(``Eagle3DeepseekV2ForCausalLM``, EAGLE-3.1 flags on) over a tiny MLA + MoE (kimi-like) target: the
drafter loads in its own layout, the search runs and reports a verdict naming the taps it scored; the
scorer's fc_norm-aware projections equal the network's own fuse."""

from __future__ import annotations

import json

import pytest
import torch

from eaglelab.engine.formats.draft_export import save_draft_checkpoint, sglang_config
from eaglelab.engine.model.config import MLAConfig
from eaglelab.engine.model.eagle3 import Eagle3Config
from eaglelab.engine.model.eagle3_mla import Eagle3MLANetwork, eagle3_network
from eaglelab.engine.model.moe import kimi_like_config
from tests.conftest import add_word_tokenizer, random_model

TCFG = kimi_like_config("cpu", num_hidden_layers=4, vocab_size=96, hidden_size=64, intermediate_size=96,
                        n_routed_experts=8, moe_intermediate_size=32, num_experts_per_tok=2, eos_token_id=2)
MLA = MLAConfig(kv_lora_rank=TCFG["kv_lora_rank"], qk_nope_head_dim=TCFG["qk_nope_head_dim"],
                qk_rope_head_dim=TCFG["qk_rope_head_dim"], v_head_dim=TCFG["v_head_dim"], q_lora_rank=TCFG["q_lora_rank"])
IDS = [0, 1, 2]  # SGLang ids of the 4-layer target: hs[1, 2, 3]

pytestmark = pytest.mark.usefixtures("one_thread")


def save_moe_dir(model, cfg: dict, path):
    """``model`` as an HF DeepSeek-V3 directory: the stacked routed experts written per expert, as HF names them."""
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        hf = name if name.startswith("lm_head") else "model." + name
        stem, _, proj = hf.rpartition(".")
        if stem.endswith(".mlp.experts"):  # [E, out, in] -> experts.{e}.{proj}.weight [out, in]
            tensors.update({f"{stem}.{e}.{proj}.weight": p[e].detach().clone().contiguous() for e in range(p.shape[0])})
        else:
            tensors[hf] = p.detach().clone().contiguous()
    save_file(tensors, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(cfg))
    return path


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """(target directory with a tokenizer, MLA drafter directory, the target model, the drafter network)."""
    root = tmp_path_factory.mktemp("mla_search")
    model = random_model(TCFG, seed=3)
    target = save_moe_dir(model, TCFG, root / "target")
    add_word_tokenizer(target, TCFG["vocab_size"])
    H = TCFG["hidden_size"]
    cfg = Eagle3Config(hidden_size=H, target_hidden_size=H, num_aux=3, num_heads=4, num_kv_heads=1,
                       head_dim=MLA.cache_dim, intermediate_size=96, vocab_size=TCFG["vocab_size"],
                       draft_vocab_size=TCFG["vocab_size"], rms_norm_eps=1e-6, mla=MLA, fc_norm=True, norm_output=True)
    net = eagle3_network(cfg, model.embed_tokens)
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in net.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            p.copy_(1.0 + 0.3 * noise if "norm" in name else 0.2 * noise)
    net.reset_buffers()
    raw = sglang_config(hidden_size=H, vocab_size=cfg.vocab_size, draft_vocab_size=cfg.draft_vocab_size, aux_layer_ids=IDS,
                        num_attention_heads=4, num_key_value_heads=1, intermediate_size=96, target_hidden_size=H,
                        rms_norm_eps=1e-6, fc_norm=True, norm_output=True, mla=MLA)
    drafter = save_draft_checkpoint(root / "drafter", raw, {k: v.detach().clone() for k, v in net.state_dict().items()})
    return target, drafter, model, net.eval()


def test_drafter_for_search_builds_the_mla_layout_and_scores_with_fc_norm(dirs):
    from eaglelab.probes.tap_search import AgreementScorer, drafter_for_search, in_memory_pass

    _, drafter, model, want = dirs
    ck, net = drafter_for_search(drafter, model.embed_tokens, TCFG["hidden_size"])
    assert isinstance(net, Eagle3MLANetwork) and net.config.fc_norm and net.config.norm_output
    ids = torch.randint(3, TCFG["vocab_size"], (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        tp = in_memory_pass(model, ids, torch.tensor([7, 7]), net.token_map(), None)
    scorer = AgreementScorer(net, tp)
    taps = (1, 2, 3)
    fused = sum(scorer._projection(s, c) for s, c in enumerate(taps))  # what the scorer feeds the midlayer
    aux = torch.cat([tp.hidden_states[c][:, :-1] for c in taps], dim=-1)
    with torch.no_grad():
        assert torch.allclose(fused, want.fuse(aux), atol=1e-5)
        assert not torch.allclose(fused, want.fc(aux), atol=1e-3)  # fc_norm matters here
    score = scorer(taps)
    assert score.loss > 0 and 0.0 <= score.agreement <= 1.0


@pytest.mark.parametrize("mode", [[], ["--stream"]], ids=["in-memory", "streamed"])
def test_check_wiring_search_runs_on_the_mla_drafter(dirs, capsys, mode):
    from eaglelab.cli import main

    target, drafter, _, _ = dirs
    rc = main(["check-wiring", str(drafter), "--target", str(target), "--search", "--samples", "6",
               "--new-tokens", "6", "--device", "cpu", "--dtype", "float32", "--json", *mode])
    out = json.loads(capsys.readouterr().out)
    assert out["verdict"] in ("ok", "mismatch", "inconclusive") and rc == {"ok": 0, "mismatch": 1, "inconclusive": 4}[out["verdict"]]
    assert out["checked"] == "search"
    assert out["config_hf_indices"] == [1, 2, 3] and len(out["best_hf_indices"]) == 3
    assert [s["slot"] for s in out["slots"]] == [0, 1, 2] and out["tokens"] > 0 and out["texts"] == 6


def test_streamed_target_notes_are_printed_by_capture_and_check_wiring(dirs, tmp_path, capsys, monkeypatch):
    """What a streamed target dequantized (``StreamedTarget.notes``) reaches stderr in ``capture --stream``,
    ``check-wiring --data --stream`` and ``check-wiring --search --stream``, as ``run`` prints a loaded target's."""
    from eaglelab.cli import main
    from eaglelab.engine.formats.streamed import StreamedTarget

    note = "layers.1 routed experts: FP8 blocks dequantized to float32 on load"
    monkeypatch.setattr(StreamedTarget, "notes", property(lambda self: (note,)))
    monkeypatch.setenv("COLUMNS", "1000")
    target, drafter, _, _ = dirs
    prompts = tmp_path / "answers.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"w{i} w{i + 4}", "response": f"w{i + 1} w{i + 9} w{i + 2}"}) + "\n"
                               for i in range(4)))
    capsys.readouterr()
    assert main(["capture", "--model", str(target), "--out", str(tmp_path / "data"), "--prompts-file", str(prompts),
                 "--batch-size", "2", "--device", "cpu", "--dtype", "float32", "--draft-vocab-size", "32",
                 "--layer-ids", "0,1,2", "--stream"]) == 0
    assert note in capsys.readouterr().err
    for extra in (["--data", str(tmp_path / "data")], ["--search", "--samples", "6"]):
        main(["check-wiring", str(drafter), "--target", str(target), "--device", "cpu", "--dtype", "float32",
              "--stream", "--json", *extra])
        got = capsys.readouterr()
        assert note in got.err and json.loads(got.out)["verdict"] != "error", extra
