"""benchmarks/ab_constants.py: each flag sets the engine constant it names before the command runs (the A/B of a
device stage depends on it), and the command's own exit code comes back."""

from __future__ import annotations

import pytest

pytest.importorskip("triton", reason="Triton not installed: the kernels' constants live in modules that import it")

import eaglelab.engine.model.decode_attention_kernels as attention_kernels  # noqa: E402
import eaglelab.engine.model.gemv as gemv  # noqa: E402
import eaglelab.engine.model.gemv_kernels as gemv_kernels  # noqa: E402
import eaglelab.engine.model.layers as layers  # noqa: E402
import eaglelab.engine.runtime.compile as compile_  # noqa: E402
import eaglelab.engine.runtime.cycle_kernels as cycle_kernels  # noqa: E402
import eaglelab.engine.runtime.shrink as shrink  # noqa: E402
from benchmarks.ab_constants import main  # noqa: E402
from eaglelab.engine.model.eagle3 import Eagle3Network  # noqa: E402
from eaglelab.engine.model.model import Transformer  # noqa: E402

CONSTANTS = [(gemv_kernels, "EARLY_TILES"), (gemv_kernels, "EARLY_TILES_ONE_ROW"), (layers, "SHARE_MASK"),
             (compile_, "COMBO_KERNELS"), (compile_, "COMBO_WITH_PDL"), (cycle_kernels, "EXPAND_ONE_LAUNCH"),
             (attention_kernels, "ONE_LAUNCH_ROWS"), (Transformer, "logits"), (Eagle3Network, "head"),
             (gemv, "FEW_ROWS"), (gemv, "MANY_ROWS"), (gemv, "SHARES"), (gemv, "MAX_ROWS"), (shrink, "SHRINK")]


def test_each_flag_sets_its_constant_before_the_command(monkeypatch, tmp_path, capsys):
    for owner, name in CONSTANTS:  # put back after the test
        monkeypatch.setattr(owner, name, getattr(owner, name))
    # each switch the first command turns on starts off here, whatever main's defaults are, and the reverse
    monkeypatch.setattr(compile_, "COMBO_KERNELS", False)
    monkeypatch.setattr(compile_, "COMBO_WITH_PDL", False)
    monkeypatch.setattr(cycle_kernels, "EXPAND_ONE_LAUNCH", False)
    monkeypatch.setattr(attention_kernels, "ONE_LAUNCH_ROWS", 0)
    monkeypatch.setattr(layers, "SHARE_MASK", True)
    plain_logits = Transformer.logits
    missing = tmp_path / "no_such_record.json"
    code = main(["--early-tiles", "0", "--one-row-tiles", "1", "--mask-per-layer", "--combo-kernels", "on",
                 "--combo-with-pdl", "--expand-one-launch", "on", "--attention-one-launch", "on", "--float32-logits",
                 "--", "report", str(missing)])
    assert code != 0 and "expected: a regular file" in capsys.readouterr().err  # the command ran: no such file
    assert (gemv_kernels.EARLY_TILES, gemv_kernels.EARLY_TILES_ONE_ROW) == (0, 1)
    assert not layers.SHARE_MASK and compile_.COMBO_KERNELS and compile_.COMBO_WITH_PDL
    assert cycle_kernels.EXPAND_ONE_LAUNCH and attention_kernels.ONE_LAUNCH_ROWS >= 64 * 64
    assert Transformer.logits is not plain_logits  # float32 copies patched back in
    main(["--combo-kernels", "off", "--combo-with-pdl", "off", "--expand-one-launch", "off", "--attention-one-launch",
          "off", "--", "report", str(missing)])
    assert not (compile_.COMBO_KERNELS or compile_.COMBO_WITH_PDL or cycle_kernels.EXPAND_ONE_LAUNCH
                or attention_kernels.ONE_LAUNCH_ROWS)
    main(["--attention-one-launch-rows", "8", "--", "report", str(missing)])
    assert attention_kernels.ONE_LAUNCH_ROWS == 8
    few, many = gemv.FEW_ROWS, gemv.MANY_ROWS
    main(["--gemv-tilings", "8,512,1,8,1;16,512,3,8,1", "--", "report", str(missing)])
    more = (gemv.GemvConfig(8, 512, 1, 8, 1), gemv.GemvConfig(16, 512, 3, 8, 1))
    assert gemv.FEW_ROWS == few + more and gemv.MANY_ROWS == many + more
    assert gemv.candidates(4)[-2:] == more and more[0] not in gemv.candidates(1)
    assert gemv.candidates(24)[-1] == more[1] and more[0] not in gemv.candidates(24)  # 24 rows' sums overflow registers
    with pytest.raises(SystemExit) as bad:  # a malformed tiling: a usage error, nothing changed, nothing run
        main(["--gemv-tilings", "8,512,1", "--", "report", str(missing)])
    assert bad.value.code == 2 and "--gemv-tilings" in capsys.readouterr().err
    assert gemv.FEW_ROWS == few + more
    for way in ("off", "on"):  # K shares added in the kernel, or by the compiled reader
        main(["--gemv-shares", way, "--", "report", str(missing)])
        assert gemv.SHARES is (way == "on") and gemv.FEW_ROWS == few + more
    main(["--shrink", "off", "--", "report", str(missing)])  # a batch kept whole until its last row ends
    assert not shrink.SHRINK
    main(["--shrink", "on", "--", "report", str(missing)])
    assert shrink.SHRINK
    main(["--gemv-max-rows", "64", "--", "report", str(missing)])  # a batch's verify back on cuBLAS
    assert gemv.MAX_ROWS == 64  # what refusal reads (tests/engine/model/test_gemv.py: 65 rows then refused)
    early = gemv_kernels.EARLY_TILES
    for rows in ("0", str(gemv.KERNEL_ROWS + 1)):  # out of range: a usage error before any constant is patched
        with pytest.raises(SystemExit) as bad:
            main(["--early-tiles", str(early + 1), "--gemv-max-rows", rows, "--", "report", str(missing)])
        assert bad.value.code == 2 and f"--gemv-max-rows: {rows} is not in 1..256" in capsys.readouterr().err
        assert (gemv.MAX_ROWS, gemv_kernels.EARLY_TILES) == (64, early)
