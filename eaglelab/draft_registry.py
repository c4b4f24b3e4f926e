"""Where a ``--draft`` value becomes a drafter, and where the tree defaults live.

Every entry point asks here: ``run``, ``trace``, ``bench`` (a real or a scale model), ``tune``, the TUI
(through :func:`eaglelab.session.build_session`) and the pytest plugin. :func:`choose_drafter` turns
("default" | "ngram" | "none" | a directory) and the tree flags into a :class:`DraftChoice`: the
:class:`SpecConfig`, a factory of fresh drafters for any spec of that kind (bench and tune build one per
configuration), and the notes a run prints. :func:`tree_defaults` fills the tree flags not given.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from eaglelab.profiles import SHIPPED_NAME, BucketChoice, DeviceProfile, find_profile, gpu_family

DRAFT_CHOICES = "default | ngram | none | PATH"
SHIPPED_DRAFTER = "smollm2-135m-eagle3"  # eaglelab/drafters/<this>: the drafter for the default model

# The spec fields a plain (--draft none) run keeps of the run's modes: graphs and compile settings, which its
# baseline shares; the verify mode and the one-graph cycle mean nothing without a drafter.
PLAIN_MODES = ("cuda_graphs", "compile", "compile_prefill")


@dataclass(frozen=True)
class TreeFlags:
    """``--steps``, ``--topk``, ``--draft-tokens`` as given (None: not given, :func:`tree_defaults` decides)."""

    steps: int | None = None
    topk: int | None = None
    draft_tokens: int | None = None
    lookup_tokens: int | None = None  # --lookup-tokens, decided apart from the tree flags (None: the profile's)

    @classmethod
    def from_args(cls, args: Any) -> "TreeFlags":
        return cls(args.steps, args.topk, args.draft_tokens, getattr(args, "lookup_tokens", None))


    @property
    def given(self) -> bool:
        return (self.steps, self.topk, self.draft_tokens) != (None, None, None)


@dataclass(frozen=True)
class TreeShape:
    """A drafter kind's tree: draft steps, children per node, tokens verified (0: the spec derives it)."""

    steps: int
    topk: int
    draft_tokens: int
    lookup_tokens: int = 0  # the prompt-lookup branch beside the tree (EAGLE-3 only)


@dataclass(frozen=True)
class Where:
    """What a tree is chosen for: the device's profile name (:func:`eaglelab.profiles.device_key`), the dtype,
    and the batch size (a device profile measures a tree per batch bucket)."""

    device: str
    dtype: str
    batch: int = 1


def tree_defaults(algorithm: str, flags: TreeFlags, measured: BucketChoice | None = None) -> TreeShape:
    """The tree for ``algorithm`` ("eagle3" | "ngram"). Every tree default lives here:

    1. any tree flag given: the flags, the constants below for the rest (a profile's tree is all or nothing:
       its steps with another topk is a tree nobody measured);
    2. else ``measured``, the device profile's bucket for this batch (:mod:`eaglelab.profiles`);
    3. else EAGLE-3: a chain (topk 1) of 3 steps, 5 steps for a tree (topk > 1): a tree offers several
       candidates a depth, so it pays to go deeper than a chain does (``eaglelab tune`` finds the fastest on
       given hardware). n-gram: always a chain (a lookup proposes one continuation) of 4 steps: a lookup
       costs no forward, so a step more than EAGLE-3's chain costs only a verify one token wider.

    The lookup branch beside an EAGLE-3 tree (``--lookup-tokens``): the flag when given, else the profile bucket's
    with the profile's tree (measured together), else none.
    """
    if algorithm == "ngram":  # (a lookup branch flagged beside it is refused by the spec, naming the flag)
        return TreeShape(flags.steps if flags.steps is not None else 4, 1, flags.draft_tokens or 0,
                         flags.lookup_tokens or 0)
    profiled = measured is not None and not flags.given
    lookup = flags.lookup_tokens if flags.lookup_tokens is not None else (measured.lookup_tokens if profiled else 0)
    if profiled:
        return TreeShape(measured.steps, measured.topk, measured.draft_tokens, lookup)
    topk = flags.topk if flags.topk is not None else 1
    steps = flags.steps if flags.steps is not None else (5 if topk > 1 else 3)
    return TreeShape(steps, topk, flags.draft_tokens or 0, lookup)


def tree_spec(algorithm: str, steps: int | None, topk: int | None, draft_tokens: int | None,
              measured: BucketChoice | None = None, *, lookup_tokens: int | None = None, **modes: Any):
    """The :class:`SpecConfig` of a drafter kind, its tree (and lookup branch) from :func:`tree_defaults` and
    ``modes`` (attention_mode, cuda_graphs, compile, ...)."""
    from eaglelab.engine.runtime.spec_config import SpecConfig

    shape = tree_defaults(algorithm, TreeFlags(steps, topk, draft_tokens, lookup_tokens), measured)
    return SpecConfig(algorithm, num_steps=shape.steps, topk=shape.topk, num_draft_tokens=shape.draft_tokens,
                      lookup_tokens=shape.lookup_tokens, **modes)


def spill_note(spec: Any, asked: bool | None) -> tuple[str, ...]:
    """What ``--lookup-spill`` (``asked`` True) did not do: a tree (batch 1's) without a lookup branch has nothing
    to spill."""
    if asked and not spec.lookup_tokens:
        return ("--lookup-spill: the tree at batch 1 has no lookup branch, so nothing spills there "
                "(--lookup-tokens K adds one)",)
    return ()


def device_profile(drafter_dir: str | None, where: Where | None) -> DeviceProfile | None:
    """The measured profile of an EAGLE-3 drafter directory on ``where``'s device and dtype, if any (tune's in
    the eaglelab cache first, then one shipped beside the drafter)."""
    if drafter_dir is None or where is None:
        return None
    from eaglelab.engine.formats.assets import cache_dir

    return find_profile(where.device, where.dtype, drafter_dir, cache_dir())


def tree_note(spec: Any, flags: TreeFlags, profile: DeviceProfile | None, where: Where | None) -> str:
    """Why the run drafts the tree it does, for the summary."""
    tree = f"tree: {spec.tree_label}"
    if flags.given:
        return f"{tree} (as flagged{'; the device profile is used only when no tree flag is given' if profile else ''})"
    if profile is None:
        device = f" on {where.device} ({where.dtype})" if where else ""
        return (f"{tree} (default: no measured profile for this drafter{device}; "
                f"`eaglelab tune` measures one)")
    batch = where.batch if where else 1
    bucket = profile.bucket(batch)
    origin = "the drafter's shipped profile" if Path(profile.path).name == SHIPPED_NAME else f"profile {profile.path}"
    if profile.stands_in_for:
        origin += (f"; none measured on {profile.stands_in_for} itself: this {gpu_family(profile.device)} GPU's "
                   "stands in, `eaglelab tune` measures its own")
    if bucket.measured_on:
        origin = (f"lent by the {gpu_family(bucket.measured_on)} profile measured on {bucket.measured_on}: {origin} "
                  f"has no tree measured for batch {batch}, `eaglelab tune --batch-sizes {batch}` measures one")
    return (f"{tree} (measured best for batch <= {bucket.max_batch} on {bucket.measured_on or profile.device}, "
            f"{profile.dtype}: {bucket.measured or 'no figure recorded'}; {origin})")


def shipped_drafter_dir() -> Path | None:
    """The EAGLE-3 drafter shipped inside the package for the default model, if present."""
    path = Path(__file__).parent / "drafters" / SHIPPED_DRAFTER
    return path if (path / "config.json").exists() else None


def resolve_draft(draft: str, model: str, field: str = "--draft") -> tuple[str, str | None]:
    """The drafter a ``--draft`` value names ("default" | "ngram" | "none" | a directory), with a note
    on what "default" chose. "default" is the drafter shipped for the default model, else n-gram."""
    from eaglelab.engine.errors import EagleLabError

    if draft == "default":
        shipped = shipped_drafter_dir()
        if shipped is not None and model == "default":
            return str(shipped), "drafter: the EAGLE-3 drafter shipped for SmolLM2-135M-Instruct"
        why = "no drafter ships for this model" if model != "default" else "no shipped drafter installed"
        return "ngram", f"drafter: n-gram ({why})"
    if draft in ("ngram", "none") or Path(draft).exists():
        return draft, None
    raise EagleLabError("no such drafter", field=field, found=draft, expected=DRAFT_CHOICES)


@dataclass(frozen=True)
class DraftChoice:
    """What a ``--draft`` value became."""

    kind: str  # "none" | "ngram" | "eagle3"
    spec: Any  # SpecConfig: the tree and modes of this run
    make: Callable[[Any], Any] | None  # spec -> a fresh drafter of this kind (None: no speculation)
    notes: tuple[str, ...] = ()  # what "default" chose, the aux taps, why this tree: printed by run and bench
    path: str | None = None  # the drafter directory (EAGLE-3 from disk)
    profile: DeviceProfile | None = None  # the device profile measured for this drafter, where one matched
    flags: TreeFlags = TreeFlags()

    def drafter(self, spec: Any = None) -> Any:
        """A fresh drafter for ``spec`` (this choice's by default); None without speculation."""
        return self.make(spec if spec is not None else self.spec) if self.make is not None else None

    def tree_for(self, batch: int) -> TreeShape:
        """The tree for ``batch`` rows: the profile's bucket for that batch (unless tree flags were given)."""
        measured = self.profile.bucket(batch) if self.profile is not None else None
        return tree_defaults(self.kind, self.flags, measured)


def choose_drafter(draft: str, model: str, target: Any, flags: TreeFlags = TreeFlags(), *,
                   modes: dict[str, Any] | None = None, serving: str | None = None,
                   log: Callable[[str], None] | None = None, field: str = "--draft",
                   where: Where | None = None) -> DraftChoice:
    """``draft`` for the target ``target`` (a Transformer; ``model`` is its --model value), the tree from
    ``flags``, the device profile for ``where`` and :func:`tree_defaults`, ``modes`` into the spec. An EAGLE-3
    drafter is loaded once; its factory shares the network between the drafters it makes."""
    from eaglelab.engine.runtime.drafters import NgramDrafter
    from eaglelab.engine.runtime.spec_config import SpecConfig

    modes = dict(modes or {})
    name, note = resolve_draft(draft, model, field)
    notes = (note,) if note else ()
    if name == "none":
        return DraftChoice("none", SpecConfig(**{k: v for k, v in modes.items() if k in PLAIN_MODES}), None, notes)
    if name == "ngram":
        return DraftChoice("ngram", tree_spec("ngram", flags.steps, flags.topk, flags.draft_tokens,
                                              lookup_tokens=flags.lookup_tokens, **modes),
                           NgramDrafter, notes, flags=flags)
    from eaglelab.engine.formats.drafter_loader import load_eagle3

    net, taps, reason = load_eagle3(name, target, serving=serving, warn=log)
    profile = device_profile(name, where)
    measured = profile.bucket(where.batch) if profile is not None and where is not None else None
    spec = tree_spec("eagle3", flags.steps, flags.topk, flags.draft_tokens, measured,
                     lookup_tokens=flags.lookup_tokens, **modes)
    notes += (f"aux taps: {reason}", tree_note(spec, flags, profile, where), *spill_note(spec, modes.get("lookup_spill")))
    return DraftChoice("eagle3", spec, _eagle3_factory(net, taps), notes, path=name, profile=profile, flags=flags)


def random_drafter(draft: str, target: Any, flags: TreeFlags = TreeFlags(), *, seed: int = 1,
                   draft_vocab: int | None = None, lookup_spill: bool | None = None) -> DraftChoice:
    """The drafter of a scale model (random weights, for cost): "default" is a random EAGLE-3 drafter of the
    target's width (``draft_vocab`` tokens, default ``RANDOM_DRAFT_VOCAB``), "ngram" and "none" as for a real
    model; a directory is refused (a trained drafter's taps mean nothing on random weights)."""
    from eaglelab.engine.errors import EagleLabError
    from eaglelab.engine.model.scale_models import RANDOM_DRAFT_VOCAB, random_eagle3
    from eaglelab.engine.runtime.drafters import NgramDrafter
    from eaglelab.engine.runtime.spec_config import SpecConfig

    if draft == "none":
        return DraftChoice("none", SpecConfig(), None, ("drafter: none",))
    if draft == "ngram":
        return DraftChoice("ngram", tree_spec("ngram", flags.steps, flags.topk, flags.draft_tokens), NgramDrafter,
                           ("drafter: n-gram",), flags=flags)
    if draft != "default":
        raise EagleLabError("scale models take --draft default | ngram | none", field="--draft", found=draft)
    net, taps = random_eagle3(target, seed=seed, draft_vocab=draft_vocab or RANDOM_DRAFT_VOCAB)
    spec = tree_spec("eagle3", flags.steps, flags.topk, flags.draft_tokens, lookup_tokens=flags.lookup_tokens,
                     lookup_spill=lookup_spill)
    note = (f"drafter: random EAGLE-3 of the target's width, {net.config.draft_vocab_size}-token draft vocabulary, "
            f"taps hs{list(taps)}")
    notes = (note, *spill_note(spec, lookup_spill))
    return DraftChoice("eagle3", spec, _eagle3_factory(net, taps), notes, flags=flags)


def _eagle3_factory(net: Any, taps: tuple[int, ...]) -> Callable[[Any], Any]:
    """spec -> an Eagle3Drafter over the one loaded network."""
    from eaglelab.engine.runtime.drafters import Eagle3Drafter

    return lambda spec: Eagle3Drafter(net, spec, taps)
