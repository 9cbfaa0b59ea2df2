"""Open-ended instructions for draft-head training: free-form questions, advice and chats, seeded.

:mod:`nanospec.instructions` makes tasks whose answers mostly copy or rearrange the prompt
(summaries of template paragraphs, template translations, arithmetic). The target's answers to
open questions are different: free-form prose, lists and advice, which is what hand-written
prompts mostly get. This module writes such prompts from many templates x a broad topic list.

Nothing here mirrors a held-out prompt of ``assets/prompts/prompts.jsonl``: exact matches are
filtered by :func:`make_open_instructions`, and the lists below avoid the held-out prompts'
subjects (job interviews, book tips for children, bike lanes, lost puppies, the largest planet,
drinking water, penguins, museum tickets, eggs in boxes, the largest number in a list).
"""

from __future__ import annotations

import random

from nanospec.training.instructions import Messages, distinct_conversations

SUBJECTS = [
    # nature and science
    "volcanoes", "coral reefs", "deserts", "rainforests", "hurricanes", "the water cycle", "magnets", "sound waves",
    "black holes", "the Milky Way", "comets", "the sun", "Mars", "the speed of light", "atoms", "DNA", "cells",
    "bacteria", "viruses", "the immune system", "the brain", "muscles", "bones", "digestion", "blood",
    "evolution", "climate change", "air pollution", "soil", "mushrooms", "trees", "seeds", "butterflies", "ants",
    "sharks", "octopuses", "eagles", "camels", "bats", "spiders", "earthworms", "rivers", "mountains", "caves",
    "lightning", "fog", "wind", "rain", "ice", "salt", "sugar", "oxygen", "carbon dioxide", "plastic", "glass",
    "metals", "rust", "fire", "friction", "energy", "heat", "electric cars", "nuclear power", "wind energy",
    # technology
    "smartphones", "email", "search engines", "computer viruses", "passwords", "cloud storage", "robots",
    "artificial intelligence", "video games", "3D printers", "satellites", "GPS", "the radio", "television",
    "spreadsheets", "databases", "programming", "websites", "social media", "online shopping", "bar codes",
    # daily life
    "cooking rice", "baking bread", "making soup", "breakfast", "healthy snacks", "vegetables", "fruit",
    "coffee", "tea", "chocolate", "cheese", "pasta", "a budget", "saving money", "credit cards", "taxes",
    "renting an apartment", "moving house", "cleaning", "laundry", "a garden", "houseplants", "pets", "cats",
    "dogs", "hamsters", "a morning routine", "sleep", "stress", "exercise", "running", "yoga", "swimming",
    "walking", "stretching", "posture", "headaches", "colds", "sunscreen", "first aid", "teeth", "eyesight",
    "time management", "procrastination", "habits", "goals", "motivation", "friendship", "teamwork",
    "public speaking", "writing an email", "taking notes", "studying for exams", "learning a language",
    "reading", "libraries", "museums", "music", "painting", "photography", "dancing", "theater", "movies",
    "board games", "chess", "soccer", "basketball", "tennis", "the Olympics", "camping", "hiking", "travel",
    "trains", "airports", "bicycles", "cars", "traffic", "cities", "villages", "farms", "markets", "restaurants",
    "tipping", "birthdays", "weddings", "holidays", "gifts", "letters", "postcards", "newspapers", "maps",
    # society and history
    "the Roman Empire", "ancient Egypt", "the pyramids", "the printing press", "the Industrial Revolution",
    "the first airplane", "the moon landing", "castles", "knights", "pirates", "explorers", "inventors",
    "democracy", "elections", "laws", "courts", "money", "banks", "trade", "factories", "jobs", "volunteering",
    "recycling", "cities of the future", "public transport", "languages", "alphabets", "numbers", "calendars",
    "clocks", "time zones", "the seasons", "weather forecasts", "earthquakes", "floods", "wildfires",
]
PEOPLE = ["a child", "a teenager", "a student", "a beginner", "a busy parent", "a retired teacher", "a new employee",
          "a tourist", "my grandmother", "a friend", "a small business owner", "a nurse"]
OPEN_TEMPLATES = [
    "What is {s}?", "How do {s} work?", "Why are {s} important?", "Tell me about {s}.",
    "What are the most common mistakes people make with {s}?", "What should everyone know about {s}?",
    "Give me some tips about {s}.", "What are the pros and cons of {s}?", "How would you explain {s} to {p}?",
    "Write a short paragraph about {s}.", "Write a haiku about {s}.", "Write a limerick about {s}.",
    "Write a short story about {s}.", "Write a fun fact about {s}.", "List three questions a student might ask about {s}.",
    "What is the history of {s}?", "How has {s} changed over time?", "What is a surprising fact about {s}?",
    "How can I get better at {s}?", "What do I need to get started with {s}?", "Describe {s} in three sentences.",
    "Compare {s} and {t}.", "What do {s} and {t} have in common?", "Which is more useful, {s} or {t}? Why?",
    "Write a tweet about {s}.", "Write a title for a blog post about {s}.", "Create a quiz question about {s}.",
    "Explain {s} like I am five.", "What are some myths about {s}?", "Why do some people dislike {s}?",
    "What would the world be like without {s}?", "Give me a simple definition of {s}.",
    "What are the main parts of {s}?", "How is {s} used in everyday life?", "Teach me one thing about {s}.",
    "I am writing a school report on {s}. What should I include?", "Suggest a name for a club about {s}.",
    "Write an opening sentence for an essay about {s}.", "What are three good books or resources about {s}?",
]
ADVICE = [
    "How can I sleep better?", "How do I stay focused while working from home?", "How can I make new friends in a new city?",
    "What is a good way to start running?", "How do I write a good thank-you note?", "How should I prepare for a long flight?",
    "How can I waste less food at home?", "What can I cook with eggs, rice and spinach?", "How do I keep a houseplant alive?",
    "How do I ask my manager for a day off?", "How can I learn to type faster?", "How do I plan a picnic?",
    "How can I save money on groceries?", "What should I pack for a weekend of camping?", "How do I say no politely?",
    "How do I start a journal?", "How can I make my room tidier?", "What are good habits for a healthy heart?",
    "How do I teach my dog to sit?", "How do I choose a good password?", "How do I calm down before an exam?",
    "How can I be more patient?", "How do I make a simple budget?", "What is the best way to memorize vocabulary?",
    "How do I give good feedback to a coworker?", "How should I organize my week?", "How do I fix a flat bicycle tire?",
    "How can I reduce my screen time?", "How do I write a short speech for a friend's birthday?",
    "What are some cheap hobbies I can try?", "How can I help my child enjoy reading?", "How do I make a good cup of tea?",
]
CHATS = [
    ("I just adopted a {pet}.", "Congratulations! What would you like to know about caring for it?",
     ["What should I feed it?", "How often should I take it to the vet?", "How do I help it feel at home?"]),
    ("I am planning a trip to {city}.", "That sounds exciting! How many days will you stay?",
     ["Four days. What should I see first?", "Just a weekend. What food should I try?", "A week. Is it expensive?"]),
    ("I want to start a small vegetable garden.", "Great idea! How much space do you have?",
     ["Only a balcony. What can I grow?", "A small backyard. When should I plant?", "A few pots. Which vegetables are easiest?"]),
    ("My team has a deadline on Friday.", "That can be stressful. How is the work going so far?",
     ["We are behind. How should we catch up?", "It is fine, but we argue a lot. Any advice?"]),
    ("I want to cook something special for {name}.", "Lovely! What kind of food does {name} like?",
     ["Italian food. Any easy recipe?", "Something sweet. What dessert can I make?", "Spicy food. What do you suggest?"]),
    ("I keep forgetting people's names.", "That happens to many people. When does it happen most?",
     ["At parties. How can I remember them?", "At work meetings. Any tricks?"]),
    ("I want to learn to play {instrument}.", "That is a wonderful goal! Have you played any instrument before?",
     ["No, never. Where do I start?", "A little piano as a kid. Will that help?"]),
    ("I am moving to a new apartment next month.", "Exciting! How can I help you prepare?",
     ["What should I do first?", "How do I pack fragile things?", "How can I meet my new neighbors?"]),
    ("My computer is very slow.", "I can help. What do you mostly use it for?",
     ["Web browsing and email. What can I do?", "Games. Should I buy a new one?"]),
    ("I want to write a short story.", "Great! Do you have an idea already?",
     ["Not yet. Can you give me some ideas?", "Yes, about a dragon. How should it start?"]),
]
PETS = ["kitten", "puppy", "rabbit", "parrot", "goldfish", "hamster", "turtle"]
CITIES = ["Rome", "Tokyo", "Paris", "Lisbon", "Cairo", "New York", "Sydney", "Mexico City", "Istanbul", "Seoul",
          "Barcelona", "Vancouver", "Prague", "Nairobi", "Buenos Aires"]
INSTRUMENTS = ["the guitar", "the violin", "the drums", "the flute", "the ukulele", "the trumpet"]
NAMES = ["my mother", "my partner", "my best friend", "my neighbor", "my brother", "my sister", "my boss"]
FACTS = [
    "Who wrote Romeo and Juliet?", "What is the tallest mountain in the world?", "How many continents are there?",
    "What is the boiling point of water?", "What gas do plants take in?", "Who painted the Mona Lisa?",
    "What is the longest river in Africa?", "How many days are in a leap year?", "What is the smallest prime number?",
    "What is the chemical symbol for gold?", "Which ocean is the largest?", "What is the capital of Canada?",
    "How many hours are in a week?", "What language has the most native speakers?", "What is photosynthesis?",
    "Why do leaves change color in autumn?", "Why do cats purr?", "Why is the ocean salty?", "How do birds fly?",
    "Why do we have seasons?", "How do vaccines work?", "Why do onions make us cry?", "How are rainbows formed?",
    "Why do we yawn?", "How does a fridge keep food cold?", "Why does bread rise?", "How do bees make honey?",
    "What causes thunder?", "Why is exercise good for the brain?", "How does the heart pump blood?",
]
WORD_PROBLEMS = [
    "{n} friends share {m} pizzas equally. Each pizza has 8 slices. How many slices does each friend get?",
    "A shop sells pens for {a} dollars each. Maria buys {n} pens and pays with a {big}-dollar bill. How much change does she get?",
    "A car uses {a} liters of fuel per 100 kilometers. How much fuel does it need for {m}00 kilometers?",
    "Tom walks {a} kilometers every day. How far does he walk in {n} weeks?",
    "A class has {big} students. {a} of them are absent. What fraction of the class is present?",
    "A recipe needs {a} cups of flour for {n} cakes. How much flour is needed for {m} cakes?",
    "A movie starts at {h}:15 and lasts {n}0 minutes longer than an hour. When does it end?",
    "A garden is {a} meters long and {n} meters wide. What is its area and its perimeter?",
    "Anna saves {a} dollars every week. How many weeks does she need to save {big} dollars?",
    "A bus carries {big} passengers. At the first stop {a} get off and {n} get on. How many are on the bus now?",
    "What is {a}% of {big}?", "If x + {a} = {big}, what is x?", "What is the average of {a}, {n} and {m}?",
    "A shirt costs {big} dollars and is on sale for {a}0% off. What is the new price?",
]
WORD_ASKS = ["", " Explain step by step.", " Show your reasoning.", " Think carefully.", " Explain your answer."]
CODE_ASKS = [
    "Write a Python function that {c}.", "Write a Python class for {o}.", "Explain what a Python {k} is, with an example.",
    "What is the difference between a Python list and a {k}?", "Write a Python script that {c}, with comments.",
    "How do I {c} in Python?", "Write a JavaScript function that {c}.", "Write a SQL query that {q}.",
]
CODE_THINGS = [
    "reverses a string", "counts the vowels in a word", "finds the second largest value in a list",
    "reads a text file and prints its lines", "checks whether two words are anagrams", "returns the sum of the digits of a number",
    "converts a list of strings to uppercase", "finds common items in two lists", "returns the even numbers from a list",
    "computes the greatest common divisor of two numbers", "flattens a nested list", "counts lines in a file",
    "validates an email address", "generates a random password", "rounds a price to two decimals",
    "converts minutes to hours and minutes", "removes spaces from a string", "checks whether a list is sorted",
]
CODE_OBJECTS = ["a bank account", "a shopping cart", "a to-do list", "a rectangle", "a library book", "a student"]
CODE_KINDS = ["tuple", "dictionary", "set", "generator", "decorator", "list comprehension", "lambda", "module"]
SQL_THINGS = ["lists all customers from Spain", "counts the orders per day", "finds the five most expensive products",
              "returns the average salary per department"]
REWRITES = [
    "Rewrite this sentence to sound more polite: {x}", "Make this sentence shorter: {x}",
    "Correct the grammar in this sentence: {x}", "Turn this sentence into a question: {x}",
    "Rewrite this sentence for a child: {x}", "Translate into Spanish: {x}", "Translate into German: {x}",
    "Translate into French: {x}", "What is the tone of this sentence? {x}", "Continue this story: {x}",
]
SENTENCES = [
    "Send me the report now.", "The meeting was moved to next Tuesday because the manager is sick.",
    "I can't come to your party.", "The weather today is very nice and warm.", "She go to the store yesterday.",
    "Our team won the final game after a long and difficult season.", "The new phone has a bigger screen.",
    "He don't like apples.", "The river flooded the small village last spring.", "Please close the window.",
    "We are going to the mountains this weekend.", "The train was late again this morning.",
    "Once upon a time, a small robot woke up in an empty house.", "The cake burned because I forgot the oven.",
]


def _open(rng: random.Random) -> Messages:
    s, t = rng.sample(SUBJECTS, 2)
    return [{"role": "user", "content": rng.choice(OPEN_TEMPLATES).format(s=s, t=t, p=rng.choice(PEOPLE))}]


def _advice(rng: random.Random) -> Messages:
    return [{"role": "user", "content": rng.choice(ADVICE)}]


def _fact(rng: random.Random) -> Messages:
    return [{"role": "user", "content": rng.choice(FACTS)}]


def _chat(rng: random.Random) -> Messages:
    first, reply, follow_ups = rng.choice(CHATS)
    values = dict(pet=rng.choice(PETS), city=rng.choice(CITIES), instrument=rng.choice(INSTRUMENTS),
                  name=rng.choice(NAMES))
    return [{"role": "user", "content": first.format(**values)},
            {"role": "assistant", "content": reply.format(**values)},
            {"role": "user", "content": rng.choice(follow_ups).format(**values)}]


def _word_problem(rng: random.Random) -> Messages:
    values = dict(a=rng.randint(2, 9), n=rng.randint(2, 9), m=rng.randint(2, 9), big=rng.randint(2, 20) * 10,
                  h=rng.randint(1, 11))
    return [{"role": "user", "content": rng.choice(WORD_PROBLEMS).format(**values) + rng.choice(WORD_ASKS)}]


def _code(rng: random.Random) -> Messages:
    text = rng.choice(CODE_ASKS).format(c=rng.choice(CODE_THINGS), o=rng.choice(CODE_OBJECTS),
                                        k=rng.choice(CODE_KINDS), q=rng.choice(SQL_THINGS))
    return [{"role": "user", "content": text}]


def _rewrite(rng: random.Random) -> Messages:
    return [{"role": "user", "content": rng.choice(REWRITES).format(x=rng.choice(SENTENCES))}]


# weights: open questions dominate (the widest template x topic space); small pools get small weights
FAMILIES = [(_open, 8), (_advice, 1), (_fact, 1), (_chat, 2), (_word_problem, 2), (_code, 2), (_rewrite, 2)]


def make_open_instructions(n: int, seed: int = 0, exclude: list[Messages] | None = None) -> list[Messages]:
    """`n` distinct open-ended conversations (seeded), none equal to a conversation in `exclude`."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    rng = random.Random(f"open-{seed}")
    makers = [f for f, w in FAMILIES for _ in range(w)]
    return distinct_conversations(n, lambda attempt: rng.choice(makers)(rng), exclude, "open instructions")
