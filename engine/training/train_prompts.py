"""Training prompts built offline, never from the benchmark (MT-bench).

Three sources, all on this machine:

* ``pydoc``: passages of Python's own reference manual (``pydoc_data.topics``), with questions
  about them ("Explain ...", "Give an example ...");
* ``docstrings``: docstrings of standard-library modules (json, re, collections, itertools, ...),
  with questions about the functions and classes they document;
* ``self_instruct``: seed topics crossed with instruction templates (the target then writes its own
  answers: self-distillation).

:func:`build_prompts` mixes them deterministically for a seed. The docstrings differ between
Python versions, so ``eaglelab capture`` writes the prompts it used next to the data.
"""

from __future__ import annotations

import importlib
import inspect
import random
from dataclasses import dataclass

SOURCES: tuple[str, ...] = ("self_instruct", "pydoc", "docstrings")
DEFAULT_MIX: dict[str, float] = {"self_instruct": 0.5, "docstrings": 0.3, "pydoc": 0.2}

DOC_MODULES: tuple[str, ...] = (
    "json", "re", "collections", "itertools", "functools", "pathlib", "argparse", "string", "textwrap",
    "datetime", "random", "statistics", "math", "heapq", "bisect", "csv", "shutil", "typing", "dataclasses",
    "enum", "logging", "os.path", "operator", "contextlib", "fractions", "decimal", "difflib", "copy",
    "glob", "fnmatch", "hashlib", "base64", "zipfile", "tempfile", "calendar", "time", "uuid", "pprint",
    "secrets", "urllib.parse", "html", "gzip", "struct", "array", "queue", "threading", "sqlite3",
)

SEED_TOPICS: tuple[str, ...] = (
    "photosynthesis", "the water cycle", "black holes", "volcanoes", "plate tectonics", "the immune system",
    "vaccines", "DNA replication", "climate change", "renewable energy", "solar panels", "wind turbines",
    "electric cars", "batteries", "the internet", "how email works", "encryption", "passwords",
    "machine learning", "neural networks", "databases", "spreadsheets", "version control", "unit testing",
    "recursion", "sorting algorithms", "binary search", "hash tables", "linked lists", "graph algorithms",
    "compound interest", "budgeting", "saving for retirement", "inflation", "supply and demand",
    "starting a small business", "job interviews", "writing a resume", "public speaking", "time management",
    "learning a new language", "studying for exams", "reading habits", "keeping a journal", "meditation",
    "sleep hygiene", "healthy breakfast ideas", "home workouts", "running a first 5k", "stretching",
    "drinking enough water", "cooking rice", "baking bread", "making pasta sauce", "vegetarian dinners",
    "coffee brewing", "tea ceremonies", "growing tomatoes", "houseplants", "composting", "bird watching",
    "caring for a dog", "adopting a cat", "aquariums", "beekeeping", "camping", "hiking safety",
    "packing for a trip", "visiting Japan", "the Roman Empire", "ancient Egypt", "the printing press",
    "the industrial revolution", "the moon landing", "the history of chess", "the Olympic games",
    "soccer tactics", "learning to swim", "playing guitar", "music theory basics", "jazz", "classical music",
    "painting with watercolors", "photography composition", "writing poetry", "writing a short story",
    "film editing", "board games", "video game design", "origami", "knitting", "woodworking",
    "fixing a flat bicycle tire", "changing a car tire", "saving energy at home", "recycling",
    "ocean currents", "coral reefs", "rainforests", "deserts", "glaciers", "earthquakes", "hurricanes",
    "the solar system", "Mars exploration", "telescopes", "the speed of light", "gravity", "magnetism",
    "electric circuits", "simple machines", "chemical reactions", "the periodic table", "acids and bases",
    "fractions", "prime numbers", "probability", "statistics for beginners", "geometry", "algebra",
    "the Pythagorean theorem", "calculus intuition", "logic puzzles", "critical thinking", "debate",
    "negotiation", "giving feedback", "team meetings", "remote work", "friendship", "kindness",
    "dealing with stress", "motivation", "habits", "goal setting", "volunteering", "city planning",
    "public transportation", "bridges", "skyscrapers", "architecture styles", "museums", "libraries",
    "the history of money", "cryptocurrency", "online privacy", "social media", "smartphones",
    "3D printing", "robots", "drones", "self-driving cars", "space stations", "satellites", "weather forecasts",
    "rainbows", "the seasons", "tides", "migrating birds", "bees and pollination", "dinosaurs", "evolution",
    "fossils", "the human heart", "the brain", "nutrition labels", "vitamins", "first aid", "handwashing",
    "dental care", "posture", "ergonomics at a desk", "minimalism", "decluttering", "moving to a new city",
    "renting an apartment", "buying a used car", "planning a birthday party", "writing a thank-you note",
    "wedding speeches", "parenting tips", "teaching kids to read", "homeschooling", "online courses",
    "open source software", "the command line", "Python lists", "Python dictionaries", "regular expressions",
    "JSON files", "web APIs", "HTML and CSS", "JavaScript basics", "SQL queries", "cloud computing",
    "containers", "debugging", "code review", "technical documentation", "data visualization",
)

TEMPLATES: tuple[str, ...] = (
    "Explain {t} to a beginner.",
    "Give me three practical tips about {t}.",
    "Write a short paragraph about {t}.",
    "What are the most common misconceptions about {t}?",
    "Write a short poem about {t}.",
    "Summarize the key ideas of {t} in a few bullet points.",
    "What are the pros and cons of {t}?",
    "Write a friendly email to a colleague about {t}.",
    "Create a simple step-by-step guide about {t}.",
    "Explain {t} to a ten-year-old.",
    "Write three quiz questions, with answers, about {t}.",
    "Tell me an interesting fact about {t} and explain why it matters.",
)

PYDOC_TEMPLATES: tuple[str, ...] = (
    "Explain the following passage from the Python reference manual in simple terms:\n\n{x}",
    "Read this excerpt from Python's documentation and give a short code example that illustrates it:\n\n{x}",
    "Summarize this part of the Python documentation in a few sentences:\n\n{x}",
)

DOC_TEMPLATES: tuple[str, ...] = (
    "What does `{name}` do? Here is its documentation:\n\n{doc}\n\nExplain it with an example.",
    "Write a short Python example that uses `{name}`. Its docstring says:\n\n{doc}",
    "Explain when I would use `{name}` in a Python program.",
)


@dataclass(frozen=True)
class TrainPrompt:
    """One prompt and where it came from."""

    text: str
    source: str  # one of SOURCES


def self_instruct_prompts() -> list[str]:
    """Every seed topic crossed with every template (topics x templates)."""
    return [tpl.format(t=t) for t in SEED_TOPICS for tpl in TEMPLATES]


def _chunks(text: str, size: int) -> list[str]:
    """Split on blank lines into pieces of about ``size`` characters."""
    out, cur = [], ""
    for para in text.split("\n\n"):
        if cur and len(cur) + len(para) > size:
            out.append(cur.strip())
            cur = ""
        cur += para + "\n\n"
    if cur.strip():
        out.append(cur.strip())
    return [c[: size + size // 2] for c in out if len(c) > 80]


def pydoc_prompts(max_chars: int = 700) -> list[str]:
    """Questions over passages of ``pydoc_data.topics`` (the reference manual's topics)."""
    from pydoc_data.topics import topics

    out = []
    for key in sorted(topics):
        for j, chunk in enumerate(_chunks(topics[key], max_chars)[:8]):
            out.append(PYDOC_TEMPLATES[(j + len(key)) % len(PYDOC_TEMPLATES)].format(x=chunk))
    return out


def _documented(module_name: str) -> list[tuple[str, str]]:
    """(qualified name, first paragraphs of the docstring) for a module's public callables."""
    try:
        mod = importlib.import_module(module_name)
    except ImportError:
        return []
    found = []
    for name in sorted(getattr(mod, "__all__", None) or dir(mod)):
        if name.startswith("_"):
            continue
        obj = getattr(mod, name, None)
        if not (inspect.isfunction(obj) or inspect.isclass(obj) or inspect.isbuiltin(obj)):
            continue
        doc = inspect.getdoc(obj) or ""
        if len(doc) < 40:
            continue
        found.append((f"{module_name}.{name}", doc[:600].strip()))
    return found


def docstring_prompts() -> list[str]:
    """Questions about documented standard-library functions and classes."""
    out = []
    for module_name in DOC_MODULES:
        for j, (name, doc) in enumerate(_documented(module_name)):
            out.append(DOC_TEMPLATES[j % len(DOC_TEMPLATES)].format(name=name, doc=doc))
    return out


def prompt_pools() -> dict[str, list[str]]:
    """All candidate prompts by source, deduplicated, in a fixed order."""
    pools = {"self_instruct": self_instruct_prompts(), "pydoc": pydoc_prompts(), "docstrings": docstring_prompts()}
    return {k: list(dict.fromkeys(v)) for k, v in pools.items()}


def build_prompts(n: int, seed: int = 0, mix: dict[str, float] | None = None) -> list[TrainPrompt]:
    """``n`` distinct prompts mixed from the sources (``mix``: share per source), shuffled by ``seed``.

    When a source runs out, the others fill in; asking for more than all pools hold returns them all.
    """
    mix = mix or DEFAULT_MIX
    rng = random.Random(seed)
    pools = {k: rng.sample(v, len(v)) for k, v in prompt_pools().items()}
    total = sum(mix.values())
    want = {k: int(round(n * mix.get(k, 0.0) / total)) for k in SOURCES}
    picked: list[TrainPrompt] = []
    for k in SOURCES:
        picked += [TrainPrompt(t, k) for t in pools[k][: want[k]]]
        pools[k] = pools[k][want[k]:]
    rest = [TrainPrompt(t, k) for k in SOURCES for t in pools[k]]
    rng.shuffle(rest)
    picked += rest[: max(0, n - len(picked))]
    rng.shuffle(picked)
    return picked[:n]
