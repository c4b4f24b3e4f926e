"""User mistakes end in a message naming the file and a non-zero exit, never a traceback."""

from __future__ import annotations

from eaglelab.cli import main


def test_tui_refuses_a_file_that_is_not_a_record(tmp_path, capsys):
    junk = tmp_path / "server.bin"
    junk.write_bytes(b"\x00\x01 not json\nstill not json\n")
    rc = main(["tui", str(junk)])
    err = " ".join(capsys.readouterr().err.split())  # rich wraps at the terminal width
    assert rc == 2 and "not an eaglelab run record" in err and "server.bin" in err and "Traceback" not in err


def test_record_path_that_is_a_directory(tmp_path, capsys):  # refused before the model loads
    rc = main(["run", "hi", "--draft", "none", "--max-new-tokens", "2", "--record", str(tmp_path)])
    err = capsys.readouterr().err.replace("\n", "")  # rich wraps at the terminal width
    assert rc == 2 and str(tmp_path) in err and "is a directory" in err.lower() and "Traceback" not in err


def test_train_total_steps_below_one_is_refused_before_the_target_loads(tmp_path, capsys):
    # The data directory does not exist: only the flag check, which runs first, can answer.
    rc = main(["train", "--data", str(tmp_path / "none"), "--out", str(tmp_path / "out"), "--online",
               "--total-steps", "0"])
    err = " ".join(capsys.readouterr().err.split())
    assert rc == 2 and "--total-steps" in err and "out of range" in err and "Traceback" not in err


def test_check_wiring_search_negative_new_tokens_is_a_user_error(tmp_path, capsys):
    # --new-tokens -5 once reached the KV cache and ended in "internal error: IndexError" (exit 3).
    rc = main(["check-wiring", str(tmp_path / "none"), "--target", "default", "--search", "--new-tokens", "-5"])
    err = " ".join(capsys.readouterr().err.split())
    assert rc == 2 and "--new-tokens" in err and "out of range" in err and "internal error" not in err


def test_tune_json_that_is_a_directory_is_refused_before_the_measuring_pass(tmp_path, capsys):
    # Once refused only by write_json, after the whole measuring pass and the confirmation runs.
    rc = main(["tune", "--model", str(tmp_path / "no-model"), "--json", str(tmp_path)])
    err = " ".join(capsys.readouterr().err.split())
    assert rc == 2 and "--json" in err and "is a directory" in err and "no-model" not in err


def test_bench_json_that_is_a_directory_is_refused_before_any_run(tmp_path, capsys):
    # Once refused only when the report was written, after every configuration had run.
    rc = main(["bench", "--model", str(tmp_path / "no-model"), "--json", str(tmp_path)])
    err = " ".join(capsys.readouterr().err.split())
    assert rc == 2 and "--json" in err and "is a directory" in err and "no-model" not in err


def test_tune_top_below_one_is_refused(tmp_path, capsys):
    # --top 0 printed no predictions and --top -1 all but the last, both with exit 0.
    rc = main(["tune", "--from", str(tmp_path / "no-record.jsonl"), "--top", "-1"])
    err = " ".join(capsys.readouterr().err.split())
    assert rc == 2 and "--top" in err and "out of range" in err


def test_prompts_count_and_distill_limit_below_one_are_refused_by_the_flag_layer(tmp_path, capsys):
    for argv, flag in ((["prompts", "--out", str(tmp_path / "p"), "--count", "0"], "--count"),
                       (["distill", "--prompts", str(tmp_path / "none"), "--out", str(tmp_path / "d"), "--limit", "0"],
                        "--limit")):
        rc = main(argv)
        err = " ".join(capsys.readouterr().err.split())
        assert rc == 2 and flag in err and "out of range" in err, (argv, err)


def test_distill_mix_refuses_the_flags_its_parts_set_before_anything_loads(tmp_path, capsys, monkeypatch):
    """With --mix, --limit, --max-new-tokens and --max-prompt-tokens are each a part's own: given on the command
    line they would be ignored, so each is exit 2 naming the flag and the mix field, before the spec is read."""
    from eaglelab.engine.training import distill_mix

    def read_mix(path):
        raise AssertionError("the mix spec was read before the flags were checked")

    monkeypatch.setattr(distill_mix, "read_mix", read_mix)
    for flag, key in (("--limit", "limit"), ("--max-new-tokens", "max_new_tokens"),
                      ("--max-prompt-tokens", "max_prompt_tokens")):
        rc = main(["distill", "--mix", str(tmp_path / "mix.json"), "--out", str(tmp_path / "d"), flag, "7"])
        err = " ".join(capsys.readouterr().err.split())
        assert rc == 2 and f"field '{flag}'" in err and "found: 7" in err and f'"{key}": N' in err, err
        assert "Traceback" not in err


def test_distill_with_prompts_and_no_length_flags_caps_at_256_and_512(tmp_path, capsys):
    """Left out with --prompts, the answer and prompt caps are the help's defaults, as distill.json records."""
    import json

    from tests.conftest import add_word_tokenizer, random_model, save_hf_dir, tiny_config

    cfg = tiny_config()
    model = save_hf_dir(random_model(cfg), cfg, tmp_path / "tiny")
    add_word_tokenizer(model, vocab=cfg["vocab_size"])
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "w1 w2 w3"}) + "\n")
    assert main(["distill", "--prompts", str(prompts), "--out", str(tmp_path / "d"), "--model", str(model),
                 "--device", "cpu", "--batch-size", "1", "--time-limit", "0.001"]) == 0, capsys.readouterr().err
    settings = json.loads((tmp_path / "d" / "distill.json").read_text())["settings"]
    assert (settings["max_new_tokens"], settings["max_prompt_tokens"]) == (256, 512)


def test_train_init_from_a_missing_drafter_is_refused_before_the_data_loads(tmp_path, capsys):
    missing = tmp_path / "no-drafter"
    rc = main(["train", "--data", str(tmp_path / "no-data"), "--out", str(tmp_path / "out"), "--init-from", str(missing)])
    err = " ".join(capsys.readouterr().err.split())
    assert rc == 2 and str(missing) in err and "no such directory" in err and "no-data" not in err


def test_distill_out_of_memory_names_batch_size_and_keeps_the_shards_written(tmp_path, capsys, monkeypatch):
    # A --batch-size the device cannot hold (a static cache of batch x slots) ended in "internal error:
    # OutOfMemoryError ... this is a bug in eaglelab" (exit 3). Here the second of two batches runs out.
    import json

    import torch

    from eaglelab.engine.training import distill as D
    from tests.conftest import add_word_tokenizer, random_model, save_hf_dir, tiny_config

    cfg = tiny_config()
    model = save_hf_dir(random_model(cfg), cfg, tmp_path / "tiny")
    add_word_tokenizer(model, vocab=cfg["vocab_size"])
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"w{i} w{i + 1} w{i + 2}"}) + "\n" for i in range(4)))
    real, calls = D.Distiller._generate, []

    def runs_out_second(self, prompt_ids, batch):
        calls.append(len(batch))
        if len(calls) == 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 34.00 GiB")
        return real(self, prompt_ids, batch)

    monkeypatch.setattr(D.Distiller, "_generate", runs_out_second)
    rc = main(["distill", "--prompts", str(prompts), "--out", str(tmp_path / "d"), "--model", str(model),
               "--device", "cpu", "--max-new-tokens", "2", "--batch-size", "2"])
    err = " ".join(capsys.readouterr().err.split())
    assert rc == 2 and "--batch-size" in err and "out of memory" in err and "34.00 GiB" in err, err
    assert "internal error" not in err and "Traceback" not in err
    assert calls == [2, 2] and len(D.shard_paths(tmp_path / "d")) == 1  # the first batch's shard is kept


def test_out_of_memory_in_any_command_is_a_resource_error_naming_its_size_flags(tmp_path, capsys, monkeypatch):
    # train, bench, run ... running out of memory ended in "internal error: OutOfMemoryError ... this is a bug
    # in eaglelab" (exit 3): it is a size the device cannot hold, the user's to shrink.
    import torch

    from eaglelab import cmd_bench, training_jobs

    def device_runs_out(*_a, **_k):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 12.00 GiB\nmore detail")

    def host_runs_out(*_a, **_k):
        raise MemoryError()

    monkeypatch.setattr(training_jobs, "read_data_manifest", device_runs_out)
    rc = main(["train", "--data", str(tmp_path), "--out", str(tmp_path / "out"), "--device", "cpu"])
    err = " ".join(capsys.readouterr().err.split())
    assert rc == 2 and "out of device memory" in err and "12.00 GiB" in err and "more detail" not in err, err
    assert "--batch-size" in err and "--max-length" in err and "--device" in err, err
    assert "internal error" not in err and "Traceback" not in err

    monkeypatch.setattr(cmd_bench, "bench", host_runs_out)
    rc = main(["bench", "--model", str(tmp_path / "no-model")])
    err = " ".join(capsys.readouterr().err.split())
    assert rc == 2 and "out of host (CPU) memory" in err and "MemoryError" in err, err
    assert "--batch-sizes" in err and "--max-new-tokens" in err and "--device" in err, err
    assert "--batch-size " not in err and "internal error" not in err and "Traceback" not in err


def test_a_cpu_allocation_that_fails_is_out_of_memory_and_other_runtime_errors_are_not():
    from eaglelab.errors import is_out_of_memory

    assert is_out_of_memory(RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate "
                                         "memory: you tried to allocate 1099511627776 bytes."))
    assert not is_out_of_memory(RuntimeError("shape '[2, 3]' is invalid for input of size 5"))
    assert not is_out_of_memory(ValueError("out of range"))


def test_a_real_failed_cpu_allocation_in_a_command_is_a_resource_error(tmp_path, capsys, monkeypatch):
    # The allocator's own error, not a mimic: a tensor far larger than any host holds.
    import torch

    from eaglelab import training_jobs

    def allocate_too_much(*_a, **_k):
        torch.empty(1 << 60, dtype=torch.uint8)

    monkeypatch.setattr(training_jobs, "read_data_manifest", allocate_too_much)
    rc = main(["train", "--data", str(tmp_path), "--out", str(tmp_path / "out"), "--device", "cpu"])
    err = " ".join(capsys.readouterr().err.split())
    assert rc == 2 and "out of host (CPU) memory" in err and "internal error" not in err, err


def test_synthesize_ask_file_that_is_unreadable_or_empty_names_ask_and_requests(tmp_path, capsys):
    """--ask FILE reads requests, not system messages: its errors name --ask and say "request"."""
    binary, empty = tmp_path / "bin.txt", tmp_path / "empty.txt"
    binary.write_bytes(b"\xc9\xff\xfe requests")
    empty.write_text("# only a comment\n\n")
    for path, said in ((binary, "cannot read the requests"), (empty, "no request in the file")):
        rc = main(["synthesize", "--out", str(tmp_path / "o"), "--ask", str(path)])
        err = " ".join(capsys.readouterr().err.split())
        assert rc == 2 and "field '--ask'" in err and said in err and "system message" not in err, err
