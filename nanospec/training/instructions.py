"""The project's own instructions for draft-head training: templates x topics, seeded.

Seven families match the prompt categories of ``assets/prompts/prompts.jsonl`` (multi-turn chat,
translation, summarization, QA, math, RAG, code). Every instruction is made from the lists
below; the held-out prompts of that file are never produced (checked and filtered by
:func:`make_instructions`), so held-out τ measures generalisation.
"""

from __future__ import annotations

import random

Messages = list[dict]

TOPICS = [
    "a rainbow", "the moon", "a volcano", "photosynthesis", "a bicycle", "the internet", "a refrigerator",
    "honey bees", "the ocean tides", "a thunderstorm", "a vaccine", "a solar panel", "a bank account",
    "the human heart", "a compass", "earthquakes", "a library", "recycling", "a camera", "electricity",
    "a calendar", "gravity", "a democracy", "snow", "a microwave oven", "the stock market", "a map",
    "sleep", "exercise", "a battery", "clouds", "a piano", "the seasons", "a fever", "an airplane",
    "a password", "a train", "fossils", "coffee", "a forest", "a glacier", "a telescope", "soap",
    "a spider web", "bread dough", "a light bulb", "a thermometer", "dinosaurs", "a wind turbine",
]
FACT_QUESTIONS = [
    "What is the capital of {country}?", "What language do people speak in {country}?",
    "What is {country} famous for?", "Why is {thing} important?", "Who invented {invention}?",
    "How does {thing} work?", "What are three facts about {animal}?", "Where do {animal} live?",
    "What do {animal} eat?", "Why is the sky blue?", "How many legs does {animal_one} have?",
    "What is the difference between {thing} and {other}?",
]
COUNTRIES = ["France", "Japan", "Brazil", "Egypt", "Canada", "Italy", "Kenya", "India", "Mexico", "Norway",
             "Spain", "Australia", "Germany", "Peru", "Greece", "Thailand"]
INVENTIONS = ["the telephone", "the light bulb", "the printing press", "the airplane", "the radio", "the computer"]
ANIMALS = ["elephants", "penguins", "dolphins", "owls", "frogs", "bees", "wolves", "turtles", "foxes", "whales"]
ANIMAL_ONE = ["a spider", "an ant", "a dog", "a bird", "a horse", "an octopus", "a crab"]
EXPLAIN = [
    "Explain how {thing} works in simple words.", "Explain {thing} to a ten-year-old.",
    "Give me three interesting facts about {thing}.", "Describe {thing} in a short paragraph.",
    "What are the benefits and drawbacks of {thing}?", "Write a short poem about {thing}.",
    "Write a short story about a child who discovers {thing}.", "List five words related to {thing}.",
]

NAMES = ["Anna", "Ben", "Carlos", "Dina", "Emma", "Farid", "Grace", "Hugo", "Iris", "Jack", "Lena", "Mia",
         "Noah", "Omar", "Priya", "Sara", "Tom", "Yuki"]
PLACES = ["the park", "the market", "school", "the beach", "the museum", "the station", "the library", "work"]
OBJECTS = ["apples", "books", "pencils", "cookies", "stickers", "marbles", "oranges", "cards", "flowers"]
ACTIVITIES = ["reads a book", "walks to {place}", "cooks dinner", "plays football", "visits {place}",
              "writes a letter", "drinks a cup of tea", "cleans the kitchen", "buys {obj}", "waters the garden"]
TIMES = ["every morning", "on Sundays", "after school", "every evening", "twice a week", "in the summer"]
LANGUAGES = ["French", "Spanish", "German", "Italian", "Portuguese"]
FOREIGN = [
    ("Spanish", "La casa es grande y tiene un jardín bonito."), ("Spanish", "Mañana vamos a la playa con mis amigos."),
    ("Spanish", "Me gusta leer libros por la noche."), ("French", "Le chat dort sur le canapé."),
    ("French", "Nous mangeons du pain tous les matins."), ("French", "Il fait beau aujourd'hui."),
    ("German", "Ich trinke jeden Morgen einen Kaffee."), ("German", "Das Buch liegt auf dem Tisch."),
    ("Italian", "La pizza è molto buona."), ("Spanish", "Mi hermana trabaja en un hospital."),
]
SUMMARY_ASKS = ["Summarize in one sentence:", "Write a short summary of this text:", "Summarize in two sentences:",
                "Give a one-sentence summary:", "What is the main idea of this text?"]
STORY_BITS = [
    "{name} {activity} {time}.", "Last week, {name} went to {place} and bought some {obj}.",
    "The weather was cold, so {name} wore a warm coat.", "{name} wants to learn how to play the guitar.",
    "At {place}, there was a long line of people waiting.", "{name} shared the {obj} with a friend.",
    "The city plans to build a new bridge near {place}.", "Many people say that {thing} is useful in daily life.",
    "The event starts at {hour} o'clock and ends two hours later.", "Tickets cost {n} dollars for adults.",
    "Children under {small} enter for free.", "The project took {small} months to finish.",
]
RAG_ASKS = ["Read the passage and answer the question.", "Use the text to answer.", "Answer using only the passage.",
            "Answer the question from the notice."]
CODE_TASKS = [
    "returns the smallest number in a list", "checks whether a string is a palindrome", "counts the words in a sentence",
    "returns the factorial of n", "removes duplicates from a list", "returns the average of a list of numbers",
    "converts Celsius to Fahrenheit", "returns the n-th Fibonacci number", "checks whether a number is prime",
    "sorts a list of names alphabetically", "returns the longest word in a sentence", "capitalizes every word",
    "merges two dictionaries", "counts how often each letter appears in a string", "returns the last element of a list",
    "squares every number in a list", "checks whether a year is a leap year", "joins a list of words with commas",
]
CODE_SNIPPETS = [
    "x = [1, 2, 3]\nprint(sum(x) * 2)", "for i in range(4):\n    print(i + 1)", "name = 'Ada'\nprint(name.upper())",
    "def f(n):\n    return n * n\nprint(f(5))", "words = ['a', 'bb', 'ccc']\nprint([len(w) for w in words])",
    "def mul(a, b):\n    return a + b", "def is_odd(n):\n    return n % 2 == 0", "total = 0\nfor n in [3, 4]:\n    total -= n",
]
CHAT_OPENERS = [
    ("I want to learn {skill}.", "That is a great goal! How much time can you spend on it each week?",
     ["About two hours. Where should I start?", "Not much. What is the easiest first step?"]),
    ("I am going to {place} tomorrow.", "Nice! Is there anything you need help planning?",
     ["Yes. What should I bring?", "What time should I leave to avoid crowds?"]),
    ("My friend {name} has a birthday next week.", "How fun! Do you want gift ideas or party ideas?",
     ["Gift ideas, please. {name} likes {obj}.", "Party ideas. We have a small budget."]),
    ("I feel tired every afternoon.", "I am sorry to hear that. How much do you sleep at night?",
     ["About six hours. What can I change?", "Eight hours, but I drink a lot of coffee."]),
    ("Can you help me with {thing}?", "Of course! What would you like to know about {thing}?",
     ["Why is it useful?", "Can you explain it with an example?"]),
]
SKILLS = ["to cook", "to swim", "Spanish", "to draw", "to code in Python", "chess", "to play the piano", "photography"]


def _fill(template: str, rng: random.Random) -> str:
    names = {"country": COUNTRIES, "thing": TOPICS, "other": TOPICS, "invention": INVENTIONS, "animal": ANIMALS,
             "animal_one": ANIMAL_ONE, "name": NAMES, "place": PLACES, "obj": OBJECTS, "time": TIMES,
             "skill": SKILLS}
    values = {k: rng.choice(v) for k, v in names.items()}
    values.update(hour=rng.randint(1, 11), n=rng.randint(3, 40), small=rng.randint(2, 12))
    values["activity"] = rng.choice(ACTIVITIES).format(**values)
    return template.format(**values)


def _paragraph(rng: random.Random, sentences: int) -> str:
    return " ".join(_fill(s, rng) for s in rng.sample(STORY_BITS, sentences))


def _user(text: str) -> Messages:
    return [{"role": "user", "content": text}]


def multi_turn(rng: random.Random) -> Messages:
    first, reply, follow_ups = rng.choice(CHAT_OPENERS)
    seed = rng.random()
    fill = lambda t: _fill(t, random.Random(seed))  # the same name/thing in every turn
    return [{"role": "user", "content": fill(first)}, {"role": "assistant", "content": fill(reply)},
            {"role": "user", "content": fill(rng.choice(follow_ups))}]


def translation(rng: random.Random) -> Messages:
    if rng.random() < 0.4:
        lang, sentence = rng.choice(FOREIGN)
        return _user(f"Translate into English: {sentence}")
    sentence = _fill("{name} {activity} {time}.", rng)
    return _user(f"Translate into {rng.choice(LANGUAGES)}: {sentence}")


def summarization(rng: random.Random) -> Messages:
    return _user(f"{rng.choice(SUMMARY_ASKS)}\n\n{_paragraph(rng, rng.randint(3, 5))}")


def qa(rng: random.Random) -> Messages:
    return _user(_fill(rng.choice(FACT_QUESTIONS + EXPLAIN), rng))


def math(rng: random.Random) -> Messages:
    name, obj = rng.choice(NAMES), rng.choice(OBJECTS)
    a, b, c = rng.randint(2, 60), rng.randint(2, 12), rng.randint(1, 20)
    problems = [
        f"{name} has {a} {obj}. She gets {b} more and gives away {c}. How many {obj} does she have now?",
        f"A bag holds {b} {obj}. How many {obj} are in {c + 1} bags?",
        f"{name} reads {b} pages a day. How many pages does {name} read in {c + 1} days?",
        f"A ticket costs {b} dollars. How much do {c + 1} tickets cost?",
        f"There are {a + b} students and {b} tables. About how many students sit at each table?",
        f"What is {a} times {b}?", f"What is {a * b} divided by {b}?",
        f"A train travels {a} kilometers per hour for {b} hours. How far does it go?",
    ]
    ask = rng.choice([" Explain step by step.", " Show your reasoning.", "", " Show your work."])
    return _user(rng.choice(problems) + ask)


def rag(rng: random.Random) -> Messages:
    passage = _paragraph(rng, rng.randint(3, 4))
    question = rng.choice(["What time does the event start?", "How much do tickets cost for adults?",
                           "Who is mentioned in the text?", "Where did the person go?",
                           "What is the text mostly about?", "Who enters for free?"])
    return _user(f"{rng.choice(RAG_ASKS)}\n\nPassage: {passage}\n\nQuestion: {question}")


def code(rng: random.Random) -> Messages:
    roll = rng.random()
    if roll < 0.6:
        return _user(f"Write a Python function that {rng.choice(CODE_TASKS)}.")
    snippet = rng.choice(CODE_SNIPPETS)
    ask = "Explain what this Python code prints:" if roll < 0.8 else "Fix the bug in this Python code:"
    return _user(f"{ask}\n\n{snippet}")


FAMILIES = {"multi_turn": multi_turn, "translation": translation, "summarization": summarization, "qa": qa,
            "math": math, "rag": rag, "code": code}


def make_instructions(n: int, seed: int = 0, exclude: list[Messages] | None = None) -> list[Messages]:
    """`n` distinct chat conversations, the families in turn (a family that repeats itself is skipped); none equals a conversation in `exclude`."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    rng = random.Random(seed)
    families = list(FAMILIES.values())
    return distinct_conversations(n, lambda attempt: families[attempt % len(families)](rng), exclude, "instructions")


def distinct_conversations(n: int, make, exclude: list[Messages] | None, what: str,
                           exclude_last_turns: list[Messages] | None = None) -> list[Messages]:
    """Call `make(attempt)` (attempt = 1, 2, ...) until `n` distinct conversations are collected, skipping
    repeats and any conversation found in `exclude`, or whose last user turn is that of a conversation in
    `exclude_last_turns` (default: `exclude`). A multi-turn chat's last turn is a short follow-up that
    many chats share, so a caller excluding earlier pool parts bans only their whole conversations."""
    banned = {_key(m) for m in exclude or []}
    last_turn_source = exclude if exclude_last_turns is None else exclude_last_turns
    banned_texts = {m[-1]["content"].strip() for m in last_turn_source or []}
    out, seen, attempts = [], set(), 0
    while len(out) < n:
        attempts += 1
        if attempts > 50 * n + 1000:
            raise ValueError(f"could not make {n} distinct {what} from the templates")
        messages = make(attempts)
        key = _key(messages)
        if key in seen or key in banned or messages[-1]["content"].strip() in banned_texts:
            continue
        seen.add(key)
        out.append(messages)
    return out


def _key(messages: Messages) -> tuple:
    return tuple((m["role"], m["content"].strip()) for m in messages)
