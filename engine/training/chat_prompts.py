"""Conversational prompts of eight kinds, composed from slots we wrote: the ``chat`` source.

A drafter learns the target's answers to the prompts it is trained on. Chat benchmarks ask for
letters, stories, role-play, puzzles, maths, code, extraction from a given text, and explanations
of science and the humanities; a corpus of docstrings and templated tasks has little of the prose,
lists and Markdown those answers are made of. Each kind here has its own composer: a request form,
a subject, an audience, a length or format constraint, and (for extraction) a generated passage of
made-up facts with numbers to pull out. Every draw is random, so the source is endless; the corpus
builder keeps the distinct ones and drops any that shares a 13-word window with an evaluation set.

Nothing here is taken from a benchmark: the slot lists and templates are ours.
"""

from __future__ import annotations

import random
from typing import Callable, Iterator

KINDS: tuple[str, ...] = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities",
                          "followup")

NAMES = ("Ava", "Ben", "Chloe", "Daniel", "Elena", "Felix", "Gita", "Hugo", "Isla", "Jonas", "Keiko", "Leo",
         "Mina", "Nikolai", "Omar", "Priya", "Ravi", "Sofia", "Tomas", "Uma", "Victor", "Wendy", "Xavier", "Yara", "Zane")
PLACES = ("Lisbon", "Kyoto", "a coastal village in Norway", "the Scottish Highlands", "Cape Town", "Buenos Aires",
          "a small island in Greece", "Montreal", "Marrakech", "Vancouver", "Istanbul", "Hanoi", "the Atacama desert",
          "Iceland", "Prague", "New Zealand's South Island", "Tuscany", "Seoul", "Patagonia", "the Swiss Alps",
          "a national park", "a rainforest lodge", "Mexico City", "Edinburgh", "Singapore", "Copenhagen")
PRODUCTS = ("a solar-powered backpack", "a smart water bottle", "a noise-cancelling sleep mask", "a folding electric bike",
            "a language-learning app", "a plant-based protein bar", "a budgeting app for students", "a mechanical keyboard",
            "a reusable coffee cup", "an indoor herb garden kit", "a meal-planning service", "a portable projector",
            "a fitness tracker for dogs", "a recycled-plastic running shoe", "a home air purifier", "a board game about cities",
            "a subscription box for books", "a smart thermostat", "a children's coding robot", "a cordless vacuum cleaner")
EVENTS = ("a community clean-up day", "a charity fun run", "a school reunion", "a neighbourhood book swap",
          "an office move", "a product launch", "a team-building retreat", "a science fair", "a farmers' market opening",
          "a music festival", "a volunteer drive", "a museum night", "a coding workshop", "a wedding anniversary",
          "a retirement party", "a photography exhibition", "a local election debate", "a bake sale")
AUDIENCES = ("a curious teenager", "a busy parent", "a retired engineer", "a first-year university student",
             "a small-business owner", "a non-native English speaker", "a sceptical colleague", "a group of ten-year-olds",
             "a hiring manager", "a new employee", "an investor", "a hospital patient", "a tourist", "a policy maker")
TONES = ("friendly", "formal", "persuasive", "humorous", "enthusiastic", "calm and reassuring", "concise and direct",
         "warm", "professional", "playful")
LENGTHS = ("", " Keep it under {n} words.", " Use no more than {k} sentences.", " Write about {n} words.",
           " Use exactly {k} bullet points.", " Format it in Markdown with a heading.", " End with a question.",
           " Include a title.", " Give it a catchy opening line.")

WRITING_FORMS = ("an email to {who} about {what}", "a blog post about {what}", "a short story that involves {what}",
                 "a poem about {what}", "a product description for {product}", "a speech for {event}",
                 "a cover letter for a job at a company that makes {product}", "a travel blog post about a trip to {place}",
                 "a three-day itinerary for a visit to {place}", "a social media post announcing {event}",
                 "a customer review of {product}", "a press release about {event}", "an apology letter to {who} for missing {event}",
                 "a thank-you note to {who} after {event}", "a newsletter introduction for {event}",
                 "a persuasive essay on why everyone should try {product}", "a limerick about {product}",
                 "song lyrics about a summer in {place}", "a radio advertisement for {product}",
                 "a dialogue between {name} and {name2} planning {event}", "a diary entry written after a day in {place}",
                 "a motivational message for {who}", "a formal complaint about {product}", "a fairy tale set in {place}")
WRITING_VERBS = ("Write", "Draft", "Compose", "Please write", "Can you write", "Help me write", "I need")
WHO = ("my manager", "a new neighbour", "a client", "my landlord", "the school principal", "a former teacher",
       "my team", "an old friend", "the city council", "a customer", "my professor", "a job applicant")
WHAT = ("working from home", "learning to cook", "a rainy weekend", "a surprise birthday party", "moving to a new city",
        "saving money on groceries", "the first snow of the year", "a broken laptop", "a camping trip gone wrong",
        "adopting a rescue cat", "running a first marathon", "a garden in spring", "a missed train", "a lost wallet",
        "starting a book club", "a power cut", "learning the guitar", "a family road trip", "a new coffee shop",
        "volunteering at an animal shelter", "a time capsule", "an unexpected letter", "a robot assistant")

PERSONAS = ("a sommelier", "a personal trainer", "a nineteenth-century explorer", "a pirate captain", "a stand-up comedian",
            "a kindergarten teacher", "a space station commander", "a detective in 1920s London", "a travel guide in {place}",
            "a wise old wizard", "a sports coach at half-time", "a doctor explaining a diagnosis", "a hotel concierge",
            "an art critic", "a poet", "a startup mentor", "a car mechanic", "a math tutor", "a medieval knight",
            "a customer service agent", "a chef in a busy kitchen", "a debate moderator", "a famous inventor",
            "an airline pilot", "a marine biologist", "a museum guide", "a radio host", "a librarian", "a game show host")
SITUATIONS = ("A customer asks you: \"{q}\"", "Answer this question in character: \"{q}\"",
              "Greet a newcomer and explain what you do.", "Describe your proudest moment.",
              "Give your best piece of advice to a beginner.", "React to some bad news from {name}.",
              "Convince {name} to try something new.", "Describe a typical day from morning to night.",
              "Explain your job to a five-year-old.", "Tell a short anecdote about your work.")
QUESTIONS = ("What do you recommend for a first-timer?", "How did you get started?", "What is the hardest part of your job?",
             "Can you help me choose?", "What would you do in my place?", "Why should I trust you?",
             "What is the biggest mistake people make?", "How do I get better at this?", "What is your favourite memory?",
             "Is it worth the money?", "What should I avoid?", "How long does it take to learn?")

LANGS = ("Python", "JavaScript", "TypeScript", "Java", "C++", "C", "Go", "Rust", "Ruby", "SQL", "Bash", "Kotlin", "C#")
CODE_OBJECTS = ("a function", "a class", "a small program", "a command-line script", "a unit-tested function", "a generator")
CODE_SPECS = ("finds the second largest number in a list", "checks whether a year is a leap year",
              "counts word frequencies in a text", "merges overlapping intervals", "converts a decimal number to binary",
              "validates an email address with a simple rule", "implements a stack with push, pop and peek",
              "returns all permutations of a string", "finds the shortest path in a grid with obstacles",
              "implements a least-recently-used cache", "computes the edit distance between two words",
              "parses a date string like 2024-03-15 into day, month and year", "detects a cycle in a linked list",
              "finds the longest increasing subsequence", "serialises a binary tree to a string and back",
              "computes compound interest over {n} years", "simulates rolling two dice {n} times and counts the totals",
              "finds all primes below {n} with a sieve", "rotates a square matrix by 90 degrees",
              "groups anagrams from a list of words", "implements a queue with two stacks",
              "returns the k closest points to the origin", "reads a CSV file and prints the average of a column",
              "checks whether a Sudoku row, column and box are valid", "computes a moving average with window {k}",
              "compresses a string by counting repeated characters", "finds the majority element of an array",
              "reads all text files in a directory and prints the {k} most frequent words",
              "finds the median of two sorted arrays", "checks whether a string is a palindrome, ignoring punctuation",
              "scrapes the titles from an HTML page given as a string", "implements binary search on a sorted list",
              "flattens a nested list of any depth", "finds the common elements of two arrays without extra data structures",
              "converts Roman numerals to integers", "computes the nth Fibonacci number with memoisation",
              "counts the vowels and consonants in a sentence", "removes duplicates from a list while keeping the order",
              "returns the top {k} scores from a list of (name, score) pairs", "checks that the brackets in a string like ([]()) are balanced",
              "implements a trie with insert and search", "finds the lowest common ancestor of two nodes in a binary tree",
              "schedules meetings so that none overlap, using the fewest rooms", "generates all subsets of a set",
              "converts a temperature table from Celsius to Fahrenheit", "splits a bill among {k} friends with tips",
              "finds the longest common substring of two strings", "implements a simple bank account class with deposits "
              "and withdrawals", "checks whether a number is an Armstrong number", "sums the digits of a number until "
              "one digit remains")
CODE_CONCEPTS = (("a list", "a tuple"), ("a process", "a thread"), ("recursion", "iteration"), ("a class", "an interface"),
                 ("pass by value", "pass by reference"), ("a hash map", "a binary search tree"), ("SQL joins", "subqueries"),
                 ("synchronous", "asynchronous code"), ("a compiler", "an interpreter"), ("unit tests", "integration tests"),
                 ("git merge", "git rebase"), ("a stack", "a heap"), ("static typing", "dynamic typing"),
                 ("REST", "GraphQL"), ("breadth-first search", "depth-first search"), ("mutable", "immutable objects"))

STEM_TOPICS = ("photosynthesis", "black holes", "vaccines", "the water cycle", "quantum entanglement", "plate tectonics",
               "CRISPR gene editing", "the greenhouse effect", "superconductors", "antibiotics", "the Doppler effect",
               "neural networks", "nuclear fission", "the Big Bang", "DNA", "the human microbiome", "lithium-ion batteries",
               "wind turbines", "GPS", "the immune response", "earthquakes", "ocean acidification", "the theory of relativity",
               "semiconductors", "the blockchain", "compound interest", "the Fibonacci sequence", "entropy",
               "exoplanet detection", "the carbon cycle", "sleep and memory", "the placebo effect", "3D printing",
               "the Pythagorean theorem", "prime numbers", "Bayes' theorem", "hurricanes", "the speed of sound",
               "stem cells", "catalysts", "radioactive decay", "solar panels", "the periodic table", "natural selection",
               "satellite orbits", "friction", "buoyancy", "electric circuits", "Ohm's law", "the Krebs cycle",
               "protein folding", "volcanoes", "glaciers", "the ozone layer", "desalination", "nuclear power plants",
               "hydrogen fuel cells", "vaccination schedules", "antibodies", "mRNA", "the speed of light", "magnetism",
               "the half-life of a drug", "heat pumps", "the laws of thermodynamics", "chemical equilibrium", "pH",
               "the binary number system", "hash functions", "public-key encryption", "sorting algorithms",
               "machine learning overfitting", "the central limit theorem", "standard deviation", "logarithms",
               "matrix multiplication", "the Monty Hall problem", "game theory", "climate models", "soil erosion",
               "coral reefs", "pollination", "the nervous system", "sleep cycles", "gravitational waves", "dark matter")
HUMANITIES_TOPICS = ("the French Revolution", "Stoic philosophy", "the Harlem Renaissance", "the Meiji Restoration",
                     "supply and demand", "the Enlightenment", "the fall of the Berlin Wall", "Greek tragedy",
                     "the social contract", "the printing press", "minimalism in art", "the gig economy", "Confucianism",
                     "the Magna Carta", "universal basic income", "the history of jazz", "postmodern literature",
                     "the Marshall Plan", "existentialism", "the Olympic Games", "the role of museums", "Baroque music",
                     "urban planning", "the history of coffee", "the ethics of zoos", "cultural appropriation",
                     "the Spanish Golden Age", "monetary policy", "the Ottoman Empire", "impressionism", "utilitarianism",
                     "the civil rights movement", "the invention of money", "oral storytelling traditions", "free trade",
                     "inflation", "interest rates set by central banks", "fiscal policy", "unemployment", "trade tariffs",
                     "the Silk Road", "the Industrial Revolution", "the Renaissance", "ancient Egypt", "the Roman Republic",
                     "the Cold War", "decolonisation", "the United Nations", "human rights", "freedom of the press",
                     "the separation of powers", "Shakespeare's tragedies", "the Romantic poets", "magical realism",
                     "the history of photography", "modern architecture", "folk music", "the ethics of lying",
                     "Plato's cave", "Kant's categorical imperative", "Buddhism", "the Reformation", "feudalism",
                     "globalisation", "urbanisation", "social media and democracy", "the four-day work week",
                     "minimum wage laws", "public libraries", "the history of the internet", "language extinction")
EXPLAIN_FORMS = ("Explain {t} to {a}.", "What is {t}, and why does it matter?", "Give me a clear overview of {t}.",
                 "Describe {t} in simple terms, with an everyday example.", "What are three surprising facts about {t}?",
                 "How would you teach {t} in a ten-minute lesson?", "Summarize the main ideas of {t} for {a}.",
                 "What are the pros and cons of {t}?", "Compare {t} and {u}: how are they similar and different?",
                 "Write a short quiz with answers on {t}.", "What are common misunderstandings about {t}?",
                 "How has our understanding of {t} changed over time?", "Why do people disagree about {t}?",
                 "Discuss how {t} affects everyday life today.",
                 "Describe {t}. Cover its causes, its effects and one real-world example.",
                 "Imagine you are a teacher preparing a lesson on {t}. Outline the lesson plan, with activities for {a}.",
                 "What would happen if {t} suddenly changed? Walk through the consequences.",
                 "Explain how {t} works, step by step, then give a short analogy.",
                 "Write a short dialogue in which {a} asks an expert about {t}.",
                 "Evaluate the following claim about {t}: it is overrated. Give arguments on both sides.",
                 "Create a study guide on {t} with key terms, a summary and three practice questions.",
                 "Which principles of {t} would you use to explain {u}? Justify your choice.")

COMPANIES = ("Northwind Labs", "Bluefin Foods", "Cedar Logistics", "Helio Motors", "Quartz Health", "Lumen Books",
             "Orbit Games", "Pinecrest Bank", "Riverstone Energy", "Tandem Bikes", "Vela Textiles", "Zephyr Air")
CITIES = ("Arbor Falls", "Brightwater", "Copperfield", "Dunmore", "Eastvale", "Fairhaven", "Glenrock", "Harrowgate",
          "Ironbridge", "Juniper Bay", "Kingsmere", "Larkspur")
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December")


def _fill(rng: random.Random, text: str) -> str:
    """Fill the shared slots of a template."""
    name, name2 = rng.sample(NAMES, 2)
    return text.format(who=rng.choice(WHO), what=rng.choice(WHAT), product=rng.choice(PRODUCTS), event=rng.choice(EVENTS),
                       place=rng.choice(PLACES), name=name, name2=name2, n=rng.choice((50, 80, 100, 150, 200, 300)),
                       k=rng.randint(2, 6), q=rng.choice(QUESTIONS))


HIGHLIGHTS = ("the history", "the local food", "the people you met", "the cost", "what went wrong", "the main benefits",
              "the schedule", "a personal story", "practical tips", "the surprising parts", "the environmental impact",
              "what you would change", "the key numbers", "the next steps", "cultural experiences", "must-see attractions")


def writing(rng: random.Random) -> str:
    form = _fill(rng, rng.choice(WRITING_FORMS))
    tone = rng.choice(("", f" Use a {rng.choice(TONES)} tone.", f" Write it for {rng.choice(AUDIENCES)}."))
    a, b = rng.sample(HIGHLIGHTS, 2)
    focus = rng.choice(("", "", f" Highlight {a} and {b}.", f" Mention {a}, and ask specifically about {b}."))
    return f"{rng.choice(WRITING_VERBS)} {form}.{tone}{focus}{_fill(rng, rng.choice(LENGTHS))}"


def roleplay(rng: random.Random) -> str:
    persona = _fill(rng, rng.choice(PERSONAS))
    opener = rng.choice(("Pretend you are {p}.", "Act as {p}.", "You are {p}.", "Imagine you are {p}.",
                         "Role-play as {p}.")).format(p=persona)
    return f"{opener} {_fill(rng, rng.choice(SITUATIONS))}{_fill(rng, rng.choice(LENGTHS[:4]))}"


def reasoning(rng: random.Random) -> str:
    names = rng.sample(NAMES, 4)
    a, b, c = rng.randint(2, 9), rng.randint(10, 60), rng.randint(3, 12)
    forms = (
        f"{names[0]} is taller than {names[1]}, and {names[1]} is taller than {names[2]}. Is {names[2]} taller than "
        f"{names[0]}? Explain your reasoning.",
        f"{names[0]}, {names[1]} and {names[2]} each own one pet: a cat, a dog and a parrot. {names[0]} is allergic to "
        f"fur and {names[1]} does not own the dog. Who owns which pet?",
        f"If it takes {a} machines {a} minutes to make {a} widgets, how long would {b} machines take to make {b} widgets?",
        f"A bat and a ball cost ${a}.{c:02d} in total, and the bat costs ${a} more than the ball. How much is the ball?",
        f"{names[0]} was born {b} years before {names[1]}, who is {c} years older than {names[2]}. {names[2]} is {b - 5} "
        f"years old. How old is {names[0]}?",
        f"In a race, {names[0]} finishes ahead of {names[1]} but behind {names[2]}; {names[3]} finishes last. What is the "
        f"finishing order?",
        f"All {rng.choice(('squirrels', 'poets', 'engineers', 'pilots'))} in a town are early risers, and {names[0]} is an "
        f"early riser. Can we conclude that {names[0]} is one of them? Why or why not?",
        f"There are {c} people at a party and everyone shakes hands with everyone else once. How many handshakes are there?",
        f"A clock shows {rng.randint(1, 12)}:{rng.choice(('00', '15', '30', '45'))}. What is the angle between the hands?",
        f"{names[0]} faces north, turns {rng.choice(('left', 'right'))}, then turns around, then turns "
        f"{rng.choice(('left', 'right'))} again. Which direction is {names[0]} facing now?",
        f"Today is {rng.choice(('Monday', 'Tuesday', 'Wednesday', 'Thursday', 'Friday', 'Saturday', 'Sunday'))}. "
        f"What day of the week will it be in {b + c} days?",
        f"A farmer has {b} sheep and all but {c} run away. How many are left? Think carefully.",
        f"You have {a + 2} coins and one is heavier than the others. With a balance scale, what is the fewest number of "
        f"weighings that always finds it? Explain.",
        f"Which is the odd one out: {', '.join(rng.sample(('apple', 'banana', 'carrot', 'cherry', 'grape', 'pear'), 3))} "
        f"or {rng.choice(('potato', 'onion', 'lettuce'))}? Explain.",
    )
    return rng.choice(forms) + rng.choice(("", " Think step by step.", " Show your reasoning.", ""))


def math(rng: random.Random) -> str:
    a, b, c, d = rng.randint(2, 20), rng.randint(2, 30), rng.randint(1, 15), rng.randint(2, 9)
    forms = (
        f"Solve the equation {a}x - {b} = {c}x + {d * 3}.",
        f"Solve the system: x + y = {a + b}, x - y = {a - b}.",
        f"Find the derivative of f(x) = {a}x^3 - {b}x^2 + {c}x - {d}.",
        f"Evaluate the integral of {a}x^2 + {b} from 0 to {d}.",
        f"The vertices of a triangle are (0, 0), ({a}, 0) and (0, {b}). What is its area and its perimeter?",
        f"What is the remainder when {a * 1000 + b} is divided by {d}?",
        f"If f(x) = {a}x^2 - {b}x + {c}, find f({d}) and f(-{d}).",
        f"A bag holds {a} red and {b} blue marbles. Two are drawn without replacement. What is the probability both are red?",
        f"How many ways can {d + 2} people sit in a row if two of them must sit together?",
        f"What is the sum of the first {a + 10} odd numbers? Prove the pattern.",
        f"Find the greatest common divisor and least common multiple of {a * d} and {b * d}.",
        f"A circle has a circumference of {a * 2} cm. What is its area?",
        f"An investment of ${b * 100} earns {c}% interest compounded yearly. What is it worth after {d} years?",
        f"Find all real solutions of x^2 - {a + b}x + {a * b} = 0.",
        f"What is the {d + 5}th term of the arithmetic sequence {a}, {a + c}, {a + 2 * c}, ...?",
        f"Prove that the sum of two odd numbers is even, then give an example with {2 * a + 1} and {2 * b + 1}.",
        f"Convert {a * b + c} from base 10 to base {rng.choice((2, 3, 5, 8, 16))}.",
        f"A car uses {d} litres of fuel per 100 km. How much fuel does a trip of {b * 10 + c} km need?",
        f"A shop sells {a} notebooks on Monday and {b} on Tuesday; on Wednesday it sells {c} fewer than on the two days "
        f"together. How many notebooks did it sell over the three days?",
        f"A train leaves at 9:00 travelling at {b * 5} km/h; a second leaves the same station at 10:00 at {b * 5 + 20} km/h. "
        f"When does the second catch up?",
        f"A rectangle's length is {d} cm more than twice its width, and its perimeter is {2 * (3 * a + d)} cm. Find its "
        f"dimensions and area.",
        f"Each of {a} students buys {d} pencils at ${c}.50 each and gets a {rng.choice((10, 15, 20))}% discount. What do "
        f"they pay in total?",
    )
    return rng.choice(forms) + rng.choice(("", " Show your work.", " Explain each step.", ""))


def coding(rng: random.Random) -> str:
    lang = rng.choice(LANGS)
    spec = rng.choice(CODE_SPECS).format(n=rng.choice((10, 20, 50, 100, 1000)), k=rng.randint(2, 9))
    x, y = rng.choice(CODE_CONCEPTS)
    forms = (
        f"Write {rng.choice(CODE_OBJECTS)} in {lang} that {spec}.",
        f"Implement a {lang} solution that {spec}, and explain its time complexity.",
        f"How would you write code in {lang} that {spec}? Give the code and a short explanation.",
        f"Explain the difference between {x} and {y}, with a short {lang} example.",
        f"When should I use {x} instead of {y} in {lang}?",
        f"Review this plan: I want a {lang} program that {spec}. What edge cases should I handle?",
        f"Write a {lang} function that {spec}, then write two test cases for it.",
        f"What is a clean way in {lang} to write code that {spec}? Avoid external libraries.",
    )
    extra = rng.choice(("", "", "", " Use recursion.", " Do not use built-in sorting.", " Add type hints and comments.",
                        " Handle empty input.", " Aim for O(n) time.", " Include a docstring.", " Keep it under 30 lines."))
    return rng.choice(forms) + extra


def _passage(rng: random.Random) -> tuple[str, str]:
    """A made-up passage with facts to extract, and what it is about."""
    kind = rng.randrange(4)
    if kind == 0:
        rows = []
        for co in rng.sample(COMPANIES, 3):
            rev, prev = rng.randint(5, 900), rng.randint(5, 900)
            rows.append(f"{co} reported revenue of ${rev} million in {rng.randint(2015, 2024)}, up from ${prev} million, "
                        f"with {rng.randint(40, 9000)} employees and a new office in {rng.choice(CITIES)}.")
        return " ".join(rows), "companies"
    if kind == 1:
        rows = []
        for n in rng.sample(NAMES, 3):
            rows.append(f"{n}, aged {rng.randint(19, 70)}, moved to {rng.choice(CITIES)} in {rng.choice(MONTHS)} "
                        f"{rng.randint(2000, 2024)} and works as a {rng.choice(('nurse', 'teacher', 'architect', 'baker', 'pilot', 'chemist', 'designer'))}.")
        return " ".join(rows), "people"
    if kind == 2:
        rows = []
        for p in rng.sample(PRODUCTS, 3):
            rows.append(f"Reviewers rated {p} {rng.randint(1, 5)} out of 5 stars at a price of ${rng.randint(9, 400)}; "
                        f"{rng.choice(('they praised', 'they criticised', 'most mentioned'))} its "
                        f"{rng.choice(('battery life', 'design', 'durability', 'price', 'ease of use', 'customer support'))}.")
        return " ".join(rows), "products"
    rows = []
    for city in rng.sample(CITIES, 3):
        rows.append(f"In {rng.choice(MONTHS)}, {city} recorded {rng.randint(5, 250)} mm of rain, an average high of "
                    f"{rng.randint(-5, 38)} degrees Celsius and {rng.randint(0, 31)} sunny days.")
    return " ".join(rows), "weather"


def extraction(rng: random.Random) -> str:
    text, about = _passage(rng)
    asks = (f"Extract every {about[:-1] if about.endswith('s') else about} mentioned below with its numbers, as JSON.",
            "Read the text and present its facts as a Markdown table.",
            "From the passage, list the names and the key figures, one per line.",
            "Summarize the passage in two sentences, then answer: which entry has the highest number?",
            "Identify all dates, places and numbers in the text below and group them by entry.",
            "Return a CSV with a header row built from the facts in the text.",
            "Which entry stands out, and why? Quote the relevant facts from the passage.")
    return f"{rng.choice(asks)}\n\n{text}"


def _explain(rng: random.Random, topics: tuple[str, ...]) -> str:
    t, u = rng.sample(topics, 2)
    text = rng.choice(EXPLAIN_FORMS).format(t=t, u=u, a=rng.choice(AUDIENCES))
    return text + _fill(rng, rng.choice(LENGTHS))


def stem(rng: random.Random) -> str:
    return _explain(rng, STEM_TOPICS)


def humanities(rng: random.Random) -> str:
    return _explain(rng, HUMANITIES_TOPICS)


DRAFT_KINDS = ("email", "paragraph", "story opening", "product description", "note", "speech opening")
FOLLOW_UPS = ("Now rewrite it as a limerick.", "Now rewrite it in a formal tone.", "Now make it half as long.",
              "Now rewrite it for {a}.", "Now turn it into a list of bullet points.", "Now summarize it in one sentence.",
              "Now rewrite it as a tweet of under 280 characters.", "Now add a title and a closing line.",
              "Now rewrite it from the point of view of {name}.", "Now critique it: what works, and what would you improve?",
              "Now rewrite it without using the letter 'e' where you can, and explain what you changed.",
              "Now continue it with two more paragraphs.", "Now rewrite it as a short poem with rhymes.",
              "Now fix any grammar problems and make it more persuasive.", "Now turn it into a dialogue between two people.",
              "Now rewrite every sentence so that it starts with a different letter.", "Now translate it into plain English for {a}.",
              "Now rewrite it in the style of a news report.", "Now write a reply to it.")


def _draft(rng: random.Random) -> tuple[str, str]:
    """A short first draft of some kind, made of slots: (what it is, its text)."""
    kind = rng.choice(DRAFT_KINDS)
    name, name2 = rng.sample(NAMES, 2)
    what, product, event, place = rng.choice(WHAT), rng.choice(PRODUCTS), rng.choice(EVENTS), rng.choice(PLACES)
    sentences = [
        f"Last {rng.choice(MONTHS)}, {name} and {name2} finally tried {what}.",
        f"We are excited to announce {event} in {rng.choice(CITIES)} next {rng.choice(MONTHS)}.",
        f"Meet {product}: it is built for people who are always on the move.",
        f"The trip to {place} was longer than planned, but nobody complained.",
        f"I am writing to ask whether we could move our meeting about {event} to {rng.choice(('Monday', 'Friday', 'next week'))}.",
        f"Nobody expected {what} to change the whole neighbourhood.",
        f"{name} said the hardest part was {rng.choice(HIGHLIGHTS)}.",
        f"In the end, {rng.randint(3, 40)} people signed up, which was {rng.choice(('more', 'fewer'))} than we hoped.",
        f"It costs ${rng.randint(9, 300)} and comes with a {rng.randint(1, 5)}-year warranty.",
        f"Thank you for your patience while we sort out {what}.",
    ]
    return kind, " ".join(rng.sample(sentences, rng.randint(3, 5)))


def followup(rng: random.Random) -> str:
    """A two-turn exchange in one message: a draft (the first turn's answer, given), then a second request."""
    kind, text = _draft(rng)
    ask = rng.choice(FOLLOW_UPS).format(a=rng.choice(AUDIENCES), name=rng.choice(NAMES))
    a = "an" if kind[0] in "aeiou" else "a"
    opener = rng.choice((f"Here is {a} {kind} I wrote:", f"You wrote this {kind} for me earlier:",
                         f"My colleague drafted this {kind}:", f"Read this {kind}:"))
    return f"{opener}\n\n{text}\n\n{ask}"


COMPOSERS: dict[str, Callable[[random.Random], str]] = {
    "writing": writing, "roleplay": roleplay, "reasoning": reasoning, "math": math, "coding": coding,
    "extraction": extraction, "stem": stem, "humanities": humanities, "followup": followup,
}


def chat_prompts(rng: random.Random) -> Iterator[tuple[str, str]]:
    """(kind, prompt) forever, the eight kinds in turn (equal shares)."""
    while True:
        for kind in KINDS:
            yield kind, COMPOSERS[kind](rng)
