"""`bench --eos`: rows end at the model's end of sequence, as served requests do, in our engine and the HF peer
alike; without it every row runs --max-new-tokens."""

from __future__ import annotations

import json

import pytest


@pytest.mark.usefixtures("one_thread")
def test_bench_eos_ends_rows_at_the_models_end_of_sequence(tmp_path, capsys):
    """--eos: each row ends at SmolLM2's end of sequence, as a served request does, plain and speculative alike (in
    float32 the same tokens); without it every row runs --max-new-tokens."""
    from eaglelab.cli import main

    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps({"question_id": 1, "category": "writing",
                                     "turns": ["Reply with the single word: yes."]}) + "\n")
    reports = {}
    for mode, extra in (("eos", ["--eos"]), ("ignored", [])):
        out = tmp_path / f"bench_{mode}.json"
        rc = main(["bench", "--model", "default", "--device", "cpu", "--questions", str(questions), "--prompts", "1",
                   "--batch-sizes", "1", "--max-new-tokens", "48", "--repeats", "1", "--no-micro",
                   "--configs", "plain-eager,spec-decode", "--json", str(out), *extra])
        assert rc == 0
        reports[mode] = json.loads(out.read_text())
    assert reports["eos"]["settings"]["eos_token_ids"] and reports["ignored"]["settings"]["eos_token_ids"] == []
    ended = {r["config"]: r["tokens"] for r in reports["eos"]["rows"]}
    assert ended["plain-eager"] == ended["spec-decode"] < 48  # the answer ends well before the cap
    assert {r["tokens"] for r in reports["ignored"]["rows"]} == {48}
    assert "each ending at the model's EOS" in " ".join(reports["eos"]["notes"])


def test_bench_eos_refuses_a_scale_model(capsys):
    from eaglelab.cli import main

    assert main(["bench", "--scale-model", "tiny", "--device", "cpu", "--eos"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "--eos" in err and "--scale-model tiny" in err and "Traceback" not in err


@pytest.mark.parametrize("flags, continuous, model_eos, ends_at", [
    ([], False, (2,), ()),  # in batches: every row --max-new-tokens long, the same tokens in every configuration
    ([], True, (2,), (2,)),  # served: requests end where their answers end, as a server's do
    ([], True, (), ()),  # served on a scale model: nothing to honour, every row runs --max-new-tokens
    (["--no-eos"], True, (2,), ()),
    (["--eos"], False, (2, 7), (2, 7)),
])
def test_eos_is_honoured_by_default_only_when_serving(flags, continuous, model_eos, ends_at):
    """`bench --continuous` ends rows at the model's EOS unless --no-eos; batches ignore it unless --eos."""
    from eaglelab.bench.setup import _eos_ids
    from eaglelab.cli import build_parser

    args = build_parser().parse_args(["bench", *flags, *(["--continuous"] if continuous else [])])
    assert _eos_ids(args, {"eos": model_eos}) == ends_at


def test_the_bench_parser_leaves_eos_to_the_mode(capsys):
    """No flag: None (the mode decides); --eos / --no-eos: the user's choice."""
    from eaglelab.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["bench"]).eos is None
    assert parser.parse_args(["bench", "--continuous", "--no-eos"]).eos is False
    assert parser.parse_args(["bench", "--eos"]).eos is True


def test_the_hf_peer_keeps_a_row_up_to_its_first_end_of_sequence():
    from eaglelab.bench.harness import until_eos

    assert until_eos([5, 7, 2, 0, 0], (2,)) == [5, 7, 2]
    assert until_eos([5, 7, 9], (2, 3)) == [5, 7, 9]
    assert until_eos([3, 2], (2, 3)) == [3]


def test_the_hf_peer_with_eos_stops_a_row_where_the_model_emits_it():
    """The peer's greedy rows with an EOS id: the row as without it, cut after that id's first occurrence."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from eaglelab.bench.harness import hf_generate_fn

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=2, max_position_embeddings=64)
    model = LlamaForCausalLM(cfg).eval()
    cpu = torch.device("cpu")
    full = hf_generate_fn(model, cpu)([[1, 2, 3]], 8).tokens[0]
    assert len(full) == 8
    eos = full[2]
    cut = hf_generate_fn(model, cpu, (eos,))([[1, 2, 3]], 8).tokens[0]
    assert cut == full[: full.index(eos) + 1]
