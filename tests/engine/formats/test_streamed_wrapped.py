"""The layer-streamed target (``--stream``) on Kimi-K2.5's checkpoint layout: the multimodal wrapper's
config (``KimiK25ForConditionalGeneration``, the DeepSeek-V3 text model and its ``quantization_config``
under ``text_config``) and every tensor under ``language_model.`` (routed experts INT4 pack-quantized by
compressed-tensors itself, a vision tower beside them). The streamed pass equals HF transformers' forward on
the library's decompressed weights, and ``capture --stream``, ``check-wiring --data --stream`` and
``check-wiring --search --stream`` run an MLA drafter against it."""

from __future__ import annotations

import json

import pytest
import torch

from eaglelab.engine.formats.streamed import StreamedTarget

pytest.importorskip("compressed_tensors", reason="compressed-tensors (test extra) writes the checkpoints here")
from tests.engine.formats import test_quantized_ct as ct  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

IDS = [0, 1, 2]  # SGLang ids of the 4-layer target: hs[1, 2, 3]


def wrap_as_kimi(flat, out):
    """``flat`` (an HF DeepSeek-V3 directory) rewritten as Kimi-K2.5 ships: names under language_model.,
    the text config (with its quantization_config) under text_config, a vision tower beside it."""
    from safetensors.torch import load_file, save_file

    state = load_file(str(flat / "model.safetensors"))
    renamed = {("language_model." + k): v for k, v in state.items()}  # model.* -> language_model.model.*
    renamed["vision_tower.patch_embed.proj.weight"] = torch.randn(8, 3)
    out.mkdir()
    save_file(renamed, str(out / "model.safetensors"))
    text = json.loads((flat / "config.json").read_text())
    text.pop("architectures", None)
    wrapper = {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
               "text_config": {**text, "model_type": "kimi_k2"}, "vision_config": {"hidden_size": 8},
               "tie_word_embeddings": False}
    (out / "config.json").write_text(json.dumps(wrapper))
    return out


@pytest.fixture(scope="module")
def kimi(tmp_path_factory):
    """(the HF model on the decompressed weights, the wrapped INT4 directory with a tokenizer, the drafter)."""
    from eaglelab.engine.formats.draft_export import save_draft_checkpoint, sglang_config
    from eaglelab.engine.model.config import MLAConfig
    from eaglelab.engine.model.eagle3 import Eagle3Config
    from eaglelab.engine.model.eagle3_mla import eagle3_network
    from tests.conftest import add_word_tokenizer, draw_drafter_weights

    root = tmp_path_factory.mktemp("kimi-wrapped")
    mp = pytest.MonkeyPatch()
    mp.setitem(ct.TINY, "num_hidden_layers", 4)  # three routed-expert layers, taps 1..3
    try:
        hf, flat = ct.write_int4(root)
    finally:
        mp.undo()
    path = wrap_as_kimi(flat, root / "kimi-k2.5-tiny")
    add_word_tokenizer(path, ct.TINY["vocab_size"])
    t = ct.TINY
    mla = MLAConfig(kv_lora_rank=t["kv_lora_rank"], qk_nope_head_dim=t["qk_nope_head_dim"],
                    qk_rope_head_dim=t["qk_rope_head_dim"], v_head_dim=t["v_head_dim"], q_lora_rank=t["q_lora_rank"])
    H, V = t["hidden_size"], t["vocab_size"]
    cfg = Eagle3Config(hidden_size=H, target_hidden_size=H, num_aux=3, num_heads=2, num_kv_heads=1,
                       head_dim=mla.cache_dim, intermediate_size=96, vocab_size=V, draft_vocab_size=48,
                       rms_norm_eps=1e-6, mla=mla)
    net = draw_drafter_weights(eagle3_network(cfg, torch.nn.Embedding(V, H)), torch.Generator().manual_seed(7))
    raw = sglang_config(hidden_size=H, vocab_size=V, draft_vocab_size=48, aux_layer_ids=IDS, num_attention_heads=2,
                        num_key_value_heads=1, intermediate_size=96, target_hidden_size=H, rms_norm_eps=1e-6, mla=mla)
    state = {k: v.detach().clone() for k, v in net.state_dict().items() if not k.startswith("embed")}
    drafter = save_draft_checkpoint(root / "drafter", raw, state)
    return hf, path, drafter


def test_wrapped_int4_target_streams_like_hf(kimi):
    """Every hidden state within 1e-4 of HF's on the library-decompressed weights; the same greedy tokens."""
    hf, path, _ = kimi
    x = torch.randint(0, ct.TINY["vocab_size"], (1, 10), generator=torch.Generator().manual_seed(4))
    st = StreamedTarget(path)
    assert st.config.architecture == "DeepseekV3ForCausalLM" and st.config.num_layers == 4
    got = st.run(x)
    with torch.no_grad():
        out = hf(x, output_hidden_states=True)
    assert len(got.hidden_states) == 5
    for i, (a, b) in enumerate(zip(got.hidden_states, out.hidden_states)):
        assert (a - b).abs().max().item() < 1e-4, f"hs[{i}]"
    assert torch.equal(got.next_tokens, out.logits.argmax(-1))
    assert "text_config" in st.notes[0] and "routed experts INT4" in st.notes[1]


def test_check_wiring_stream_reads_the_wrapped_int4_target(kimi, tmp_path, capsys, monkeypatch):
    from eaglelab.cli import main

    _, path, drafter = kimi
    monkeypatch.setenv("COLUMNS", "1000")
    prompts = tmp_path / "answers.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"w{i} w{i + 4}", "response": f"w{i + 1} w{i + 9} w{i + 2}"}) + "\n"
                               for i in range(4)))
    assert main(["capture", "--model", str(path), "--out", str(tmp_path / "data"), "--prompts-file", str(prompts),
                 "--batch-size", "2", "--device", "cpu", "--dtype", "float32", "--draft-vocab-size", "32",
                 "--layer-ids", ",".join(map(str, IDS)), "--stream"]) == 0
    assert "routed experts INT4" in capsys.readouterr().err
    for extra in (["--data", str(tmp_path / "data")], ["--search", "--samples", "4", "--new-tokens", "4"]):
        rc = main(["check-wiring", str(drafter), "--target", str(path), "--device", "cpu", "--dtype", "float32",
                   "--stream", "--json", *extra])
        got = capsys.readouterr()
        out = json.loads(got.out)
        assert out["verdict"] != "error" and rc in (0, 1, 4), (extra, got.err[-2000:])
        assert "routed experts INT4" in got.err and "text_config" in got.err, extra
