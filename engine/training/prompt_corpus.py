"""Training prompts at scale, built offline and never from the benchmarks.

Sources (every one available on a machine with no network beyond the package registry):

* ``self_instruct``: seed topics of eight kinds (writing, roleplay, reasoning, math, coding,
  extraction, STEM, humanities) crossed with instruction templates of the same kind;
* ``tasks``: templated tasks with random operands (arithmetic word problems, unit conversions,
  sequences, list and string puzzles, code-writing specs, data formatting);
* ``pydoc``: passages of Python's reference manual (``pydoc_data.topics``) with questions;
* ``docstrings``: docstrings of every importable standard-library module (and of the installed
  packages named in :data:`PACKAGE_ROOTS`), with questions about the documented callables;
* ``text_tasks``: paragraphs of those docstrings and passages under text tasks (summarise, title,
  rewrite, extract, quiz);
* ``chat``: conversational requests of the eight chat-benchmark kinds composed from slots we wrote
  (:mod:`~eaglelab.engine.training.chat_prompts`: letters, stories, role-play, puzzles, maths, code,
  extraction from a generated passage, explanations), endless like ``tasks``; the largest share,
  so the target's answers look like the chat answers a drafter is measured on.

:func:`build_corpus` draws ``count`` distinct prompts with a per-source share, deduplicated on a
normalised form, then removes every prompt that shares a 13-word window (or its whole text) with
a question of MT-bench or HumanEval, the two evaluation sets: :class:`OverlapIndex`. The answers
are the target's own (self-distillation, ``eaglelab distill``).
"""

from __future__ import annotations

import functools
import gzip
import importlib
import inspect
import json
import random
import re
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from eaglelab.engine.training.chat_prompts import chat_prompts
from eaglelab.engine.training.train_prompts import PYDOC_TEMPLATES, SEED_TOPICS, TEMPLATES, _chunks

CORPUS_VERSION = 3  # 2: the chat source, new default shares; 3: chat follow-ups, wider topics, chat 65%
NGRAM = 13  # words: the usual contamination window
SOURCES: tuple[str, ...] = ("self_instruct", "tasks", "pydoc", "docstrings", "text_tasks", "chat")
ENDLESS: tuple[str, ...] = ("tasks", "chat")  # random composers: drawn up to a multiple of their quota
DEFAULT_SHARE: dict[str, float] = {"chat": 0.65, "self_instruct": 0.1, "tasks": 0.08, "docstrings": 0.08,
                                   "text_tasks": 0.06, "pydoc": 0.03}
PACKAGE_ROOTS: tuple[str, ...] = ("numpy", "scipy", "sympy", "networkx", "torch", "rich", "jinja2", "yaml", "packaging",
                                  "requests", "jsonschema", "attr", "pygments", "hypothesis", "click")
SKIP_MODULES = re.compile(r"(^|\.)(test|tests|idlelib|tkinter|turtle|turtledemo|antigravity|this|__main__|lib2to3|"
                          r"ensurepip|venv|pydoc_data|_.*)($|\.)")

# ---- seeds ---------------------------------------------------------------------------------------

KIND_TOPICS: dict[str, tuple[str, ...]] = {
    "writing": ("a rainy morning in a small town", "the first day at a new job", "a lost dog finding its way home",
                "a lighthouse keeper", "a robot learning to paint", "a bakery that opens at midnight",
                "a letter from the future", "an old bicycle", "a chess tournament", "a mountain village in winter",
                "a scientist who discovers a new colour", "two friends reuniting after twenty years",
                "a library that never closes", "the last day of summer", "a train journey across a desert",
                "a garden on a rooftop", "a musician's first concert", "a storm at sea", "a forgotten diary",
                "a city without cars", "a detective who cannot smell", "a kite festival", "a moving day",
                "a talking houseplant", "an astronaut's view of Earth", "a family recipe", "a village market",
                "a school science fair", "a marathon runner's last mile", "a clockmaker's apprentice"),
    "roleplay": ("a travel agent", "a museum tour guide", "a personal fitness coach", "a medieval innkeeper",
                 "a customer support agent for a software company", "a career counsellor", "a chef",
                 "a park ranger", "a job interviewer", "a language tutor", "a ship captain", "a librarian",
                 "a startup founder pitching to investors", "a sports commentator", "a gardening expert",
                 "a tech support specialist", "a history teacher", "a detective", "a real estate agent",
                 "a financial advisor", "a nutritionist", "a mountain guide", "a movie critic", "a barista"),
    "stem": ("photosynthesis", "black holes", "plate tectonics", "the immune system", "DNA replication",
             "climate change", "renewable energy", "electric motors", "batteries", "semiconductors",
             "the speed of light", "entropy", "chemical bonds", "the periodic table", "evolution by natural selection",
             "antibiotic resistance", "ocean currents", "earthquakes", "the greenhouse effect", "nuclear fusion",
             "magnetism", "sound waves", "optics and lenses", "the human heart", "neurons", "enzymes",
             "the nitrogen cycle", "tides", "the solar system", "exoplanets", "machine learning", "neural networks",
             "public-key cryptography", "compilers", "operating systems", "computer networks", "databases",
             "probability", "statistics", "linear algebra", "calculus", "prime numbers", "graph theory"),
    "humanities": ("the Renaissance", "the industrial revolution", "ancient Rome", "the printing press",
                   "the Silk Road", "democracy", "the scientific method", "utilitarianism", "stoicism",
                   "supply and demand", "inflation", "opportunity cost", "globalization", "urbanization",
                   "the history of writing", "impressionist painting", "jazz", "epic poetry", "the novel",
                   "human rights", "the separation of powers", "game theory", "behavioural economics",
                   "the history of medicine", "world religions", "the Cold War", "colonialism", "migration",
                   "cultural heritage", "the ethics of artificial intelligence", "free speech", "education reform"),
    "reasoning": ("scheduling meetings across time zones", "planning a trip on a budget", "choosing between two job offers",
                  "dividing chores fairly", "a logic puzzle about coloured hats", "seating guests at a dinner",
                  "comparing two mobile phone plans", "finding a bug by elimination", "deciding whether to rent or buy",
                  "packing a suitcase with a weight limit", "ordering tasks with dependencies",
                  "estimating the number of piano tuners in a city", "a river crossing puzzle",
                  "a family tree puzzle", "ranking runners from clues", "choosing the fastest route"),
}

KIND_TEMPLATES: dict[str, tuple[str, ...]] = {
    "writing": ("Write a short story about {t}.", "Write a poem about {t}.", "Write the opening paragraph of a novel about {t}.",
                "Write a haiku sequence about {t}.", "Describe {t} using vivid sensory details.",
                "Write a diary entry about {t}.", "Write a dialogue between two characters about {t}.",
                "Write a limerick about {t}.", "Write a short blog post inspired by {t}.",
                "Write a children's bedtime story about {t}."),
    "roleplay": ("Pretend you are {t}. Introduce yourself and explain what you do.",
                 "Act as {t} and answer a visitor who asks for your best advice.",
                 "You are {t}. Describe a typical day at work.", "Role-play as {t} greeting a new customer.",
                 "As {t}, explain the most common mistake beginners make.",
                 "Imagine you are {t}. What would you tell someone on their first day?"),
    "stem": ("Explain {t} to a beginner.", "Explain {t} to a ten-year-old.", "What are the most common misconceptions about {t}?",
             "Summarize the key ideas of {t} in a few bullet points.", "Give a real-world example of {t} and explain it.",
             "Write three quiz questions, with answers, about {t}.", "How would you explain {t} with an analogy?",
             "What is the history behind our understanding of {t}?", "What open questions remain about {t}?",
             "Compare {t} with a related idea and explain the difference."),
    "humanities": ("Explain {t} in simple terms.", "What are the main arguments for and against {t}?",
                   "Write a short essay about {t}.", "How did {t} change everyday life?",
                   "Summarize the key ideas of {t} in a few bullet points.", "What can we learn today from {t}?",
                   "Give three examples that illustrate {t}.", "Describe {t} to someone who has never heard of it."),
    "reasoning": ("Help me think step by step about {t}.", "Explain a clear method for {t}.",
                  "What are the key factors to weigh when {t}?", "Walk me through an example of {t}, step by step.",
                  "What mistakes do people make when {t}, and how can they be avoided?"),
}

MODIFIERS = ("", " Keep it under 100 words.", " Use a numbered list.", " Include a concrete example.",
             " Write it for a high-school student.", " End with a one-sentence summary.", " Use a friendly, casual tone.",
             " Answer in exactly three paragraphs.", " Start with a question to the reader.")

NAMES = ("Alice", "Bob", "Carmen", "Dmitri", "Emma", "Farid", "Grace", "Hiro", "Ines", "Jamal", "Kira", "Liam",
         "Maya", "Noah", "Olga", "Pablo", "Quinn", "Rosa", "Sam", "Tara", "Umar", "Vera", "Wen", "Yusuf", "Zoe")
ITEMS = ("apples", "pencils", "books", "stickers", "marbles", "cookies", "tickets", "coins", "stamps", "cupcakes",
         "flowers", "notebooks", "oranges", "balloons", "candles")
UNITS = (("kilometres", "miles", 0.621371), ("kilograms", "pounds", 2.20462), ("litres", "gallons", 0.264172),
         ("metres", "feet", 3.28084), ("centimetres", "inches", 0.393701), ("hours", "minutes", 60.0))
CODE_SPECS = (
    "returns the {k}-th largest element of a list of integers", "checks whether a string is a palindrome",
    "counts the vowels in a string", "merges two sorted lists into one sorted list",
    "returns the prime factors of {n}", "reverses the words in a sentence", "removes duplicates from a list while keeping order",
    "computes the running average of a list of numbers", "converts a Roman numeral to an integer",
    "finds the longest common prefix of a list of strings", "flattens a nested list", "groups words by their first letter",
    "returns the {k} most frequent words in a text", "validates that a string of brackets is balanced",
    "rotates a list by {k} positions", "computes the Fibonacci numbers below {n}", "transposes a matrix given as a list of lists",
    "parses a CSV line into fields", "converts Celsius to Fahrenheit for a list of readings",
    "returns the indices of two numbers in a list that add up to {n}", "chunks a list into pieces of size {k}",
    "checks whether two strings are anagrams", "computes the greatest common divisor of two numbers",
    "counts the lines, words and characters of a file", "returns the median of a list of numbers",
    "finds all pairs in a list whose difference is {k}", "implements binary search on a sorted list",
    "capitalises the first letter of every sentence", "formats a number of seconds as hours, minutes and seconds",
)
LANGS = ("Python", "JavaScript", "Go", "Rust", "Java", "C", "TypeScript", "Ruby", "Bash", "SQL")
CODE_TEMPLATES = ("Write a {lang} function that {spec}.", "Write a {lang} function that {spec}. Include a short test.",
                  "How would you write a {lang} program that {spec}? Explain your approach first.",
                  "Write a {lang} function that {spec}, and explain its time complexity.")
DOC_TEMPLATES_X = (
    "What does `{name}` do? Here is its documentation:\n\n{doc}\n\nExplain it with an example.",
    "Write a short Python example that uses `{name}`. Its docstring says:\n\n{doc}",
    "Explain when I would use `{name}` in a Python program.",
    "What are the parameters of `{name}` and what does it return? Its documentation:\n\n{doc}",
    "Explain this documentation in plain English:\n\n{doc}",
    "Give two practical use cases for `{name}`.",
)
TEXT_TEMPLATES = (
    "Summarize the following text in one sentence:\n\n{x}", "Suggest a short title for this text:\n\n{x}",
    "Rewrite this text so that a beginner can understand it:\n\n{x}",
    "List the key terms in the following text and define each briefly:\n\n{x}",
    "Write two questions that this text answers, with their answers:\n\n{x}",
    "Turn the following text into a bulleted list of its main points:\n\n{x}",
    "Rewrite the following text in a more formal tone:\n\n{x}",
    "Extract every name of a function, class or module mentioned in this text:\n\n{x}",
)


@dataclass(frozen=True)
class CorpusPrompt:
    """One prompt, its source and its kind (the task family inside the source)."""

    text: str
    source: str
    kind: str


# ---- generators (each yields prompts in a fixed order for a given rng) ------------------------------


def self_instruct(rng: random.Random) -> Iterator[CorpusPrompt]:
    """Every topic of every kind crossed with that kind's templates and every style modifier, plus the
    older generic seeds."""
    pairs = [(kind, tpl.format(t=t)) for kind, topics in KIND_TOPICS.items() for t in topics for tpl in KIND_TEMPLATES[kind]]
    pairs += [("general", tpl.format(t=t)) for t in SEED_TOPICS for tpl in TEMPLATES]
    for kind, text in pairs:
        for mod in MODIFIERS:
            yield CorpusPrompt(text + mod, "self_instruct", kind)


def _math_task(rng: random.Random) -> str:
    a, b, c = rng.randint(2, 90), rng.randint(2, 40), rng.randint(2, 12)
    name, other, item = rng.choice(NAMES), rng.choice(NAMES), rng.choice(ITEMS)
    forms = (
        f"{name} has {a} {item} and buys {b} more, then gives {c} to {other}. How many {item} does {name} have now?",
        f"{name} packs {a * c} {item} into boxes of {c}. How many boxes are needed?",
        f"A shop sells {item} at ${b} each. {name} buys {c} and pays with ${b * c + a}. How much change is due?",
        f"What is {a}% of {b * 10}? Show your working.",
        f"Solve for x: {c}x + {a} = {c * b + a}.",
        f"A train travels {a * c} km in {c} hours. What is its average speed?",
        f"What is the sum of the integers from 1 to {a * 3}? Explain the shortcut.",
        f"{name} reads {b} pages a day. How many days to finish a book of {a * b + c} pages?",
        f"A rectangle is {a} cm by {b} cm. What are its area and perimeter?",
        f"What is the next number in the sequence {c}, {c + b}, {c + 2 * b}, {c + 3 * b}, ...?",
        f"If {c} workers build a wall in {b} days, how long would {c * 2} workers take?",
        f"What is the probability of rolling a total of {rng.randint(2, 12)} with two fair dice?",
    )
    return rng.choice(forms)


def _unit_task(rng: random.Random) -> str:
    src, dst, _ = rng.choice(UNITS)
    v = rng.choice((rng.randint(1, 500), round(rng.uniform(0.5, 99.5), 1)))
    return rng.choice((f"Convert {v} {src} to {dst}.", f"How many {dst} are in {v} {src}? Explain the conversion."))


def _list_task(rng: random.Random) -> str:
    xs = [rng.randint(-50, 99) for _ in range(rng.randint(4, 9))]
    words = rng.sample(list(ITEMS + NAMES), rng.randint(4, 7))
    forms = (f"Sort these numbers in ascending order: {xs}.", f"What are the mean and the median of {xs}?",
             f"Which numbers in {xs} are even?", f"Sort these words alphabetically: {', '.join(words)}.",
             f"Count the letters in each of these words: {', '.join(words)}.",
             f"Write a sentence that uses all of these words: {', '.join(words)}.")
    return rng.choice(forms)


def _code_task(rng: random.Random) -> str:
    spec = rng.choice(CODE_SPECS).format(k=rng.randint(2, 9), n=rng.randint(10, 500))
    return rng.choice(CODE_TEMPLATES).format(lang=rng.choice(LANGS), spec=spec)


def _format_task(rng: random.Random) -> str:
    people = rng.sample(NAMES, 3)
    ages = [rng.randint(18, 80) for _ in people]
    rows = "; ".join(f"{p}, {a}" for p, a in zip(people, ages))
    return rng.choice((f"Turn this into a JSON list of objects with name and age: {rows}.",
                       f"Make a Markdown table with columns Name and Age from: {rows}.",
                       f"Write a CSV file with a header for: {rows}.",
                       f"Who is the oldest in this list, and by how many years? {rows}."))


TASKS: dict[str, Callable[[random.Random], str]] = {
    "math": _math_task, "units": _unit_task, "lists": _list_task, "code": _code_task, "format": _format_task,
}


def tasks(rng: random.Random) -> Iterator[CorpusPrompt]:
    """Templated tasks with random operands, kinds in turn (endless; the caller stops)."""
    kinds = list(TASKS)
    while True:
        kind = rng.choice(kinds)
        yield CorpusPrompt(TASKS[kind](rng), "tasks", kind)


def pydoc(rng: random.Random, max_chars: int = 700) -> Iterator[CorpusPrompt]:
    """Questions over every passage of ``pydoc_data.topics`` (each passage under two templates)."""
    from pydoc_data.topics import topics

    for key in sorted(topics):
        for j, chunk in enumerate(_chunks(topics[key], max_chars)):
            for k in range(2):
                yield CorpusPrompt(PYDOC_TEMPLATES[(j + k + len(key)) % len(PYDOC_TEMPLATES)].format(x=chunk),
                                   "pydoc", key)


def module_names(roots: tuple[str, ...] = PACKAGE_ROOTS) -> list[str]:
    """Standard-library modules and ``roots`` (those installed), with submodules two levels down."""
    import pkgutil

    out: list[str] = []
    level = sorted(n for n in sys.stdlib_module_names if not SKIP_MODULES.search(n)) + list(roots)
    for _depth in range(3):
        nxt = []
        for name in level:
            mod = _import(name)
            if mod is None or name in out:
                continue
            out.append(name)
            nxt += [i.name for i in pkgutil.iter_modules(getattr(mod, "__path__", None) or [], name + ".")
                    if not SKIP_MODULES.search(i.name)]
        level = nxt
    return out


def _import(name: str):
    """The module, or None when it cannot import here (platform-only, optional dependencies)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return importlib.import_module(name)
    except BaseException:  # noqa: BLE001 - importing arbitrary modules may raise anything, even SystemExit
        return None


def package_versions(roots: tuple[str, ...] = PACKAGE_ROOTS) -> dict[str, str]:
    """Versions of the installed ``roots``: the docstrings (so the prompts) depend on them."""
    from importlib import metadata

    out = {}
    for root in roots:
        try:
            out[root] = metadata.version({"yaml": "PyYAML", "attr": "attrs"}.get(root, root))
        except metadata.PackageNotFoundError:
            pass
    return out


def documented(module_name: str, min_chars: int = 60, max_chars: int = 700) -> list[tuple[str, str]]:
    """(qualified name, docstring head) of a module's public functions, classes and their methods."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecated attributes warn when read
        return _documented(module_name, min_chars, max_chars)


def _documented(module_name: str, min_chars: int, max_chars: int) -> list[tuple[str, str]]:
    mod = _import(module_name)
    if mod is None:
        return []
    found = []
    root = module_name.split(".")[0]
    for name in sorted(getattr(mod, "__all__", None) or dir(mod)):
        obj = getattr(mod, name, None) if isinstance(name, str) and not name.startswith("_") else None
        owner = getattr(obj, "__module__", None) or module_name
        if obj is None or not isinstance(owner, str) or owner.split(".")[0] != root:
            continue
        if inspect.isclass(obj):
            for mname, m in sorted(vars(obj).items()):
                if not mname.startswith("_") and callable(m):
                    found += _doc_entry(f"{module_name}.{name}.{mname}", m, min_chars, max_chars)
        if inspect.isfunction(obj) or inspect.isclass(obj) or inspect.isbuiltin(obj):
            found += _doc_entry(f"{module_name}.{name}", obj, min_chars, max_chars)
    return found


def _doc_entry(qual: str, obj, min_chars: int, max_chars: int) -> list[tuple[str, str]]:
    try:
        doc = inspect.getdoc(obj) or ""
    except Exception:  # noqa: BLE001 - odd descriptors
        return []
    doc = doc.strip()
    return [(qual, doc[:max_chars])] if len(doc) >= min_chars else []


def gather_doc_entries(names: list[str]) -> list[tuple[str, str]]:
    """(qualified name, docstring) of every documented callable of the modules ``names``, each docstring once, in
    this process (it imports them all)."""
    seen: dict[str, str] = {}
    for module_name in names:
        for qual, doc in documented(module_name):
            seen.setdefault(doc, qual)
    return [(qual, doc) for doc, qual in seen.items()]


def doc_entries_in_child(names: list[str] | None = None, timeout: float = 900.0) -> list[tuple[str, str]]:
    """:func:`gather_doc_entries` over ``names`` (None: :func:`module_names`, the whole walk) in a child process.

    Importing every module of the standard library and of ten packages has side effects a caller must not keep:
    torch's ``torch.distributed.debug`` registers a Python handler with a C++ registry whose destructor then runs
    after the interpreter has finalised and aborts the process at exit ("PyThreadState_Get ... finalizing"); others
    print warnings, start threads or register atexit hooks. The child writes its entries as JSON and leaves with
    ``os._exit`` (no finalisation to crash in); its output is kept out of the caller's terminal and shown only if
    it fails."""
    import subprocess
    import tempfile

    from eaglelab.engine.errors import EagleLabError

    code = ("import json, os, sys; from eaglelab.engine.training import prompt_corpus as pc; "
            "names = json.loads(sys.argv[2]); names = pc.module_names() if names is None else names; "
            "f = open(sys.argv[1], 'w'); json.dump(pc.gather_doc_entries(names), f); f.close(); os._exit(0)")
    with tempfile.TemporaryDirectory(prefix="eaglelab-docs-") as tmp:
        out = Path(tmp) / "entries.json"
        try:
            done = subprocess.run([sys.executable, "-c", code, str(out), json.dumps(names)],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                  text=True, timeout=timeout)
            failed = done.returncode != 0 or not out.is_file()
            why = f"exit status {done.returncode}" if failed else ""
            tail = "\n".join(done.stderr.strip().splitlines()[-8:])
        except subprocess.TimeoutExpired:
            failed, why, tail = True, f"no answer in {timeout:.0f} s", ""
        if failed:
            raise EagleLabError(f"the docstrings source's child process (importing modules for their docstrings) "
                                f"failed: {why}", found=tail or None,
                                hint="run `python -c \"import eaglelab.engine.training.prompt_corpus as pc; "
                                     "pc.gather_doc_entries(pc.module_names())\"` to see which import breaks; "
                                     "a package that crashes on import can be uninstalled from this environment")
        return [(qual, doc) for qual, doc in json.loads(out.read_text())]


@functools.lru_cache(maxsize=1)
def _doc_entries() -> tuple[tuple[str, str], ...]:
    """(qualified name, docstring) of every documented callable, each docstring once: the whole walk, in a child
    process (:func:`doc_entries_in_child`; ~10-30 s: cached)."""
    return tuple(doc_entries_in_child())


def docstrings(rng: random.Random) -> Iterator[CorpusPrompt]:
    """Questions about every documented callable (two templates each)."""
    for j, (qual, doc) in enumerate(_doc_entries()):
        for k in (0, 3):
            tpl = DOC_TEMPLATES_X[(j + k) % len(DOC_TEMPLATES_X)]
            yield CorpusPrompt(tpl.format(name=qual, doc=doc), "docstrings", qual.split(".")[0])


def text_tasks(rng: random.Random) -> Iterator[CorpusPrompt]:
    """Text tasks over docstring paragraphs (prose only: no doctest or signature lines)."""
    for j, (qual, doc) in enumerate(_doc_entries()):
        paras = [p.strip() for p in doc.split("\n\n") if len(p.strip()) > 120 and ">>>" not in p]
        for k, para in enumerate(paras[:2]):
            yield CorpusPrompt(TEXT_TEMPLATES[(j + k) % len(TEXT_TEMPLATES)].format(x=para), "text_tasks",
                               qual.split(".")[0])


def chat(rng: random.Random) -> Iterator[CorpusPrompt]:
    """Conversational requests of the eight chat kinds in turn (endless; the caller stops)."""
    for kind, text in chat_prompts(rng):
        yield CorpusPrompt(text, "chat", kind)


GENERATORS: dict[str, Callable[[random.Random], Iterator[CorpusPrompt]]] = {
    "self_instruct": self_instruct, "tasks": tasks, "pydoc": pydoc, "docstrings": docstrings, "text_tasks": text_tasks,
    "chat": chat,
}


# ---- dedup and overlap ---------------------------------------------------------------------------


def normalise(text: str) -> str:
    """Lower-case words of letters and digits joined by single spaces: the dedup key."""
    return " ".join(re.findall(r"[a-z0-9]+", text.lower()))


def ngrams(words: list[str], n: int = NGRAM) -> Iterator[tuple[str, ...]]:
    for i in range(max(0, len(words) - n + 1)):
        yield tuple(words[i: i + n])


@dataclass
class OverlapIndex:
    """The evaluation sets' texts, as normalised whole texts and 13-word windows."""

    names: tuple[str, ...]
    texts: set[str] = field(default_factory=set)
    grams: set[tuple[str, ...]] = field(default_factory=set)

    @classmethod
    def from_texts(cls, named: dict[str, list[str]]) -> "OverlapIndex":
        idx = cls(tuple(named))
        for texts in named.values():
            for t in texts:
                norm = normalise(t)
                idx.texts.add(norm)
                idx.grams.update(ngrams(norm.split()))
        return idx

    def hits(self, text: str) -> bool:
        """True when ``text`` equals an evaluation text or shares a 13-word window with one."""
        norm = normalise(text)
        return norm in self.texts or any(g in self.grams for g in ngrams(norm.split()))


def evaluation_texts(mtbench_file: Path | None = None, humaneval_file: Path | None = None) -> dict[str, list[str]]:
    """Every turn of MT-bench's questions and every HumanEval prompt (read from their wheels)."""
    from eaglelab.engine.formats.assets import HUMANEVAL_PROBLEMS, MTBENCH_QUESTIONS, asset_path

    mt = mtbench_file or asset_path(MTBENCH_QUESTIONS)
    he = humaneval_file or asset_path(HUMANEVAL_PROBLEMS)
    mt_turns = [t for line in mt.read_text().splitlines() if line.strip() for t in json.loads(line)["turns"]]
    with gzip.open(he, "rt") as f:
        he_prompts = [json.loads(line)["prompt"] for line in f if line.strip()]
    return {"mt_bench": mt_turns, "humaneval": he_prompts}


# ---- the corpus ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Corpus:
    """The prompts and the manifest's facts about them."""

    prompts: list[CorpusPrompt]
    counts: dict[str, int]  # per source, kept
    kinds: dict[str, int]  # per source:kind, kept
    duplicates: int
    overlaps: dict[str, int]  # per source, dropped for overlapping an evaluation set
    seed: int


def build_corpus(count: int, overlap: OverlapIndex, *, seed: int = 0, share: dict[str, float] | None = None,
                 progress: Callable[[int], None] | None = None) -> Corpus:
    """``count`` distinct prompts, per-source quotas from ``share`` (a short source's rest goes to the
    endless ``tasks``), none overlapping ``overlap``, shuffled by ``seed``."""
    share = share or DEFAULT_SHARE
    total = sum(share.values())
    quotas = {s: int(count * share.get(s, 0.0) / total) for s in SOURCES}
    quotas["tasks"] += count - sum(quotas.values())
    seen: set[str] = set()
    picked: list[CorpusPrompt] = []
    dups, overlaps = 0, {s: 0 for s in SOURCES}
    for src in sorted(SOURCES, key=lambda s: s == "tasks"):  # tasks last: it takes the shortfall
        rng = random.Random(f"{seed}:{src}")
        pool = _take(GENERATORS[src](rng), quotas[src] if src in ENDLESS else None)
        rng.shuffle(pool)
        want = quotas[src] if src != "tasks" else count - len(picked)
        got = 0
        for p in pool:
            if got >= want:
                break
            key = normalise(p.text)
            if key in seen:
                dups += 1
                continue
            seen.add(key)
            if overlap.hits(p.text):
                overlaps[src] += 1
                continue
            picked.append(p)
            got += 1
            if progress and len(picked) % 1000 == 0:
                progress(len(picked))
        if src != "tasks" and got < want:
            quotas["tasks"] += want - got
    picked += _top_up(count - len(picked), seen, overlap, seed, overlaps)
    random.Random(seed).shuffle(picked)
    kinds: dict[str, int] = {}
    for p in picked:
        kinds[f"{p.source}:{p.kind}"] = kinds.get(f"{p.source}:{p.kind}", 0) + 1
    counts = {s: sum(1 for p in picked if p.source == s) for s in SOURCES}
    return Corpus(picked, counts, dict(sorted(kinds.items())), dups, overlaps, seed)


def _take(gen: Iterator[CorpusPrompt], limit: int | None) -> list[CorpusPrompt]:
    """All of a finite source; for an endless one, 3x its quota (duplicates are expected)."""
    if limit is None:
        return list(gen)
    return [next(gen) for _ in range(3 * limit + 100)]


def _top_up(n: int, seen: set[str], overlap: OverlapIndex, seed: int, overlaps: dict[str, int]) -> list[CorpusPrompt]:
    """More distinct ``tasks`` prompts until ``n`` are added (the templates' operand space is large)."""
    out: list[CorpusPrompt] = []
    gen = tasks(random.Random(f"{seed}:top-up"))
    tries = 0
    while len(out) < n:
        tries += 1
        assert tries < 100 * n + 10_000, "the task templates cannot produce that many distinct prompts"
        p = next(gen)
        key = normalise(p.text)
        if key in seen:
            continue
        seen.add(key)
        if overlap.hits(p.text):
            overlaps["tasks"] += 1
            continue
        out.append(p)
    return out


def write_corpus(corpus: Corpus, out_dir: str | Path, overlap: OverlapIndex, extra: dict | None = None) -> Path:
    """``prompts.jsonl.gz`` ({"index", "source", "kind", "prompt"} per line) and ``manifest.json``."""
    from eaglelab.engine.formats.safe_write import write_atomic

    out = Path(out_dir)
    path = out / "prompts.jsonl.gz"

    def write(tmp: Path) -> None:
        with gzip.open(tmp, "wt", compresslevel=9) as f:
            for i, p in enumerate(corpus.prompts):
                f.write(json.dumps({"index": i, "source": p.source, "kind": p.kind, "prompt": p.text}) + "\n")

    write_atomic(path, write, what="prompt corpus")
    manifest = {
        "corpus_version": CORPUS_VERSION, "count": len(corpus.prompts), "seed": corpus.seed,
        "sources": corpus.counts, "kinds": corpus.kinds, "duplicates_removed": corpus.duplicates,
        "overlap_check": {"against": list(overlap.names), "ngram_words": NGRAM,
                          "evaluation_texts": len(overlap.texts), "dropped": corpus.overlaps},
        "python": sys.version.split()[0], "file": path.name, **(extra or {}),
    }
    text = json.dumps(manifest, indent=2) + "\n"
    write_atomic(out / "manifest.json", lambda tmp: tmp.write_text(text), what="corpus manifest")
    return path


def read_corpus(path: str | Path) -> list[dict]:
    """The records of a ``prompts.jsonl.gz`` (or plain ``.jsonl``) written by :func:`write_corpus`."""
    from eaglelab.engine.errors import ConfigError

    path = Path(path)
    if path.is_dir():
        path = path / "prompts.jsonl.gz"
    from eaglelab.engine.formats.validate import check_regular_file, check_text_value, file_kind

    if file_kind(path) == "missing":
        raise ConfigError("no such prompts file", file=path, hint="make one with `eaglelab prompts --out DIR`")
    check_regular_file(path, "a prompts file", error=ConfigError)  # a FIFO would block the reader for ever
    opener = gzip.open if path.suffix == ".gz" else open
    out = []
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    rec = json.loads(line)
                    if not isinstance(rec, dict) or not isinstance(rec.get("prompt"), str):
                        raise ConfigError(f"line {n} has no prompt", file=path, field="prompt", found=line.strip()[:80],
                                          expected='{"prompt": "...", ...}', hint="write it again with `eaglelab prompts`")
                    check_text_value(rec["prompt"], path, f"line {n}: prompt")
                    out.append(rec)
    except (OSError, EOFError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the prompts ({str(exc)[:120]})", file=path,
                          hint="write it again with `eaglelab prompts`") from None
    if not out:
        raise ConfigError("no prompts in the file", file=path)
    return out
