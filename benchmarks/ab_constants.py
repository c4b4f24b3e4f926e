"""Run one eaglelab command with an engine constant changed for an A/B across processes (a bench process each way,
as `benchmarks/gpu_loop_gaps.sh` stages E to H do): the change is made before the command imports or compiles
anything that reads it.

    python benchmarks/ab_constants.py --early-tiles 2 -- bench --scale-model smollm2-135m ...
    python benchmarks/ab_constants.py --one-row-tiles 1 --float32-logits -- bench ...
    python benchmarks/ab_constants.py --mask-per-layer -- bench ...

--early-tiles / --one-row-tiles: the GEMV's weight tiles loaded before its PDL wait at more rows / at one row
(``gemv_kernels.EARLY_TILES``, ``EARLY_TILES_ONE_ROW``); --float32-logits: the verify's and the draft steps' logits
handed on as float32 copies, as before they stayed in the heads' dtype; --mask-per-layer: a compiled forward's mask
not passed through ``layers.shared`` (inductor then builds it again for each layer's attention op);
--combo-kernels on|off: whole phases compiled with inductor's combo kernels or without (``compile.COMBO_KERNELS``:
on by default, with --pdl too while ``COMBO_WITH_PDL``); --combo-with-pdl [on|off]: ``COMBO_WITH_PDL`` (alone: on);
--expand-one-launch on|off: a draft step's expansion in one launch or two (``cycle_kernels.EXPAND_ONE_LAUNCH``);
--attention-one-launch on|off: split attention merged in its own launch at every row count, or always by a second
kernel; --attention-one-launch-rows N: in its own launch where a KV head's query rows are at most N
(``decode_attention_kernels.ONE_LAUNCH_ROWS``); --gemv-tilings 'bn,bk,split,warps,stages;...': more tilings the GEMV
tuner times at 2..``gemv.MAX_ROWS`` rows (``gemv.FEW_ROWS`` and ``MANY_ROWS``), kept where one is the fastest;
--gemv-shares on|off: a split GEMV tiling's K shares added by the compiled code that reads the output, or in the
kernel (``gemv.SHARES``);
--gemv-max-rows N: the most rows of x a call may have to take the GEMV (``gemv.MAX_ROWS``, the kernel's whole
range ``gemv.KERNEL_ROWS``, 256, past 64 in blocks of 64 rows; 64: a batch's verify on cuBLAS, as before 2026-12-07);
--shrink on|off: a batch sheds its ended rows onto a smaller batch bucket, or runs whole until its last row ends
(``shrink.SHRINK``).
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str]) -> int:
    cut = argv.index("--") if "--" in argv else len(argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--early-tiles", type=int, choices=(0, 1, 2))
    p.add_argument("--one-row-tiles", type=int, choices=(0, 1, 2))
    p.add_argument("--float32-logits", action="store_true")
    p.add_argument("--mask-per-layer", action="store_true")
    p.add_argument("--combo-kernels", choices=("on", "off"))
    p.add_argument("--combo-with-pdl", nargs="?", const="on", choices=("on", "off"))
    p.add_argument("--expand-one-launch", choices=("on", "off"))
    p.add_argument("--attention-one-launch", choices=("on", "off"))
    p.add_argument("--attention-one-launch-rows", type=int)
    p.add_argument("--gemv-tilings", metavar="BN,BK,SPLIT,WARPS,STAGES;...")
    p.add_argument("--gemv-shares", choices=("on", "off"))
    p.add_argument("--gemv-max-rows", type=int, metavar="N")
    p.add_argument("--shrink", choices=("on", "off"))
    args = p.parse_args(argv[:cut])
    from eaglelab.engine.model.gemv_tiling import KERNEL_ROWS, parse_tilings

    try:
        more = parse_tilings(args.gemv_tilings or "")
    except ValueError as exc:
        p.error(f"--gemv-tilings: {exc}")
    if args.gemv_max_rows is not None and not 1 <= args.gemv_max_rows <= KERNEL_ROWS:
        p.error(f"--gemv-max-rows: {args.gemv_max_rows} is not in 1..{KERNEL_ROWS} (the rows the kernel takes)")
    import eaglelab.engine.model.gemv_kernels as G

    if args.early_tiles is not None:
        G.EARLY_TILES = args.early_tiles
    if args.one_row_tiles is not None:
        G.EARLY_TILES_ONE_ROW = args.one_row_tiles
    if args.float32_logits:
        from eaglelab.engine.model.eagle3 import Eagle3Network
        from eaglelab.engine.model.model import Transformer

        for cls, name in ((Transformer, "logits"), (Eagle3Network, "head")):
            real = getattr(cls, name)
            setattr(cls, name, lambda self, *a, _real=real, float32=True, **k: _real(self, *a, float32=True, **k))
    if args.mask_per_layer:
        import eaglelab.engine.model.layers as L

        L.SHARE_MASK = False
    if args.combo_kernels is not None or args.combo_with_pdl is not None:
        import eaglelab.engine.runtime.compile as C

        if args.combo_kernels is not None:
            C.COMBO_KERNELS = args.combo_kernels == "on"
        if args.combo_with_pdl is not None:
            C.COMBO_WITH_PDL = args.combo_with_pdl == "on"
    if args.expand_one_launch is not None:
        import eaglelab.engine.runtime.cycle_kernels as K

        K.EXPAND_ONE_LAUNCH = args.expand_one_launch == "on"
    if args.attention_one_launch is not None or args.attention_one_launch_rows is not None:
        import eaglelab.engine.model.decode_attention_kernels as AK

        if args.attention_one_launch is not None:
            AK.ONE_LAUNCH_ROWS = 1 << 20 if args.attention_one_launch == "on" else 0
        if args.attention_one_launch_rows is not None:
            AK.ONE_LAUNCH_ROWS = args.attention_one_launch_rows
    if more or args.gemv_shares is not None or args.gemv_max_rows is not None:
        import eaglelab.engine.model.gemv as GV

        GV.FEW_ROWS, GV.MANY_ROWS = GV.FEW_ROWS + more, GV.MANY_ROWS + more
        if args.gemv_shares is not None:
            GV.SHARES = args.gemv_shares == "on"
        if args.gemv_max_rows is not None:
            GV.MAX_ROWS = args.gemv_max_rows
    if args.shrink is not None:
        import eaglelab.engine.runtime.shrink as SH

        SH.SHRINK = args.shrink == "on"
    from eaglelab.cli import main as cli

    return cli(argv[cut + 1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
