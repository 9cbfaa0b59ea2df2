"""Prompt families the older instruction lists lack: extraction, longer multi-turn chats, varied math.

Seeded generators, one conversation per call (``family(rng) -> Messages``), made from the lists below
(written for this project). They complement :mod:`nanospec.training.instructions` (short templated tasks),
:mod:`nanospec.training.open_instructions` (free-form questions) and :mod:`nanospec.training.real_tasks`
(real text): the outside prompt sets showed extraction, formatting and longer chats drafting worst.
None of these mirrors an evaluation prompt; :mod:`nanospec.training.prompt_pool` checks that anyway.
"""

from __future__ import annotations

import random

from nanospec.training.instructions import Messages

FIRST = ["Alice", "Bruno", "Chloe", "Diego", "Elena", "Felix", "Greta", "Hassan", "Ines", "Jonas", "Keiko", "Liam",
         "Marta", "Nils", "Olga", "Pablo", "Rosa", "Samir", "Tara", "Viktor", "Wen", "Zara"]
LAST = ["Garcia", "Novak", "Smith", "Okafor", "Rossi", "Larsen", "Kim", "Dubois", "Silva", "Weber", "Haddad", "Ito"]
TOWNS = ["Oakridge", "Lakeside", "Hillcrest", "Brookfield", "Westport", "Millford", "Stonebridge", "Elmwood",
         "Fairview", "Redcliff", "Ashby", "Northgate"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]
ITEMS = [("desk lamp", 18, 45), ("office chair", 60, 240), ("laptop stand", 20, 70), ("water bottle", 8, 25),
         ("backpack", 30, 120), ("keyboard", 25, 110), ("coffee grinder", 35, 150), ("rain jacket", 40, 180),
         ("tent", 90, 400), ("blender", 30, 130), ("bookshelf", 50, 260), ("headphones", 20, 300)]
ROLES = ["data analyst", "nurse", "electrician", "teacher", "graphic designer", "accountant", "chef",
         "software tester", "warehouse manager", "translator", "bus driver", "lab technician"]
SKILLS = ["Excel", "SQL", "first aid", "customer service", "Python", "scheduling", "bookkeeping", "French",
          "welding", "photo editing", "forklift licence", "team leadership"]

EXTRACT_ASKS = [
    "Extract {fields} from the text below. Answer with a JSON object.\n\n{text}",
    "From this text, pull out {fields}. Give each on its own line.\n\n{text}",
    "{text}\n\nList {fields} mentioned above as a bulleted list.",
    "Read the message and fill in a table with {fields}.\n\nMessage: {text}",
    "Find {fields} in this note and answer in the form `field: value`.\n\n{text}",
]


def _date(rng: random.Random) -> str:
    return f"{rng.choice(MONTHS)} {rng.randint(1, 28)}"


def _person(rng: random.Random) -> str:
    return f"{rng.choice(FIRST)} {rng.choice(LAST)}"


def _order_text(rng: random.Random) -> tuple[str, str]:
    item, lo, hi = rng.choice(ITEMS)
    n, price = rng.randint(1, 4), rng.randint(lo, hi)
    text = (f"Hello, this is {_person(rng)}. On {_date(rng)} I ordered {n} x {item} (order number "
            f"{rng.randint(10000, 99999)}) for {price * n} euros, delivered to {rng.choice(TOWNS)}. "
            f"{rng.choice(['It arrived damaged.', 'It never arrived.', 'I was charged twice.', 'The colour is wrong.'])} "
            f"Please {rng.choice(['refund me', 'send a replacement', 'call me back', 'check what happened'])}.")
    return text, "the customer name, the order number, the item, the amount and the request"


def _event_text(rng: random.Random) -> tuple[str, str]:
    host, town = _person(rng), rng.choice(TOWNS)
    text = (f"The {rng.choice(['spring', 'summer', 'autumn', 'winter'])} {rng.choice(['fair', 'concert', 'book sale', 'cleanup day', 'chess tournament'])} "
            f"in {town} takes place on {_date(rng)} from {rng.randint(8, 11)} am to {rng.randint(1, 6)} pm at the "
            f"{rng.choice(['town hall', 'old school', 'harbour', 'sports centre'])}. Entry is {rng.choice(['free', f'{rng.randint(2, 15)} euros'])}. "
            f"Questions go to the organiser, {host}.")
    return text, "the event, the town, the date, the time, the place, the price and the organiser"


def _job_text(rng: random.Random) -> tuple[str, str]:
    skills = rng.sample(SKILLS, rng.randint(2, 4))
    text = (f"{rng.choice(TOWNS)} {rng.choice(['Logistics', 'Health', 'Foods', 'Energy', 'Media'])} is hiring a "
            f"{rng.choice(ROLES)} ({rng.choice(['full time', 'part time', 'temporary'])}). You have "
            f"{rng.randint(1, 6)} years of experience and know {', '.join(skills)}. Apply before {_date(rng)}.")
    return text, "the company, the role, the contract type, the years of experience, the skills and the deadline"


def _contacts_text(rng: random.Random) -> tuple[str, str]:
    people = [f"{_person(rng)} ({rng.choice(ROLES)}, {rng.choice(TOWNS)}, phone {rng.randint(200, 999)}-"
              f"{rng.randint(1000, 9999)})" for _ in range(rng.randint(2, 4))]
    return "Contacts from the meeting: " + "; ".join(people) + ".", "every person's name, job, town and phone number"


def extraction(rng: random.Random) -> Messages:
    text, fields = rng.choice([_order_text, _event_text, _job_text, _contacts_text])(rng)
    return [{"role": "user", "content": rng.choice(EXTRACT_ASKS).format(fields=fields, text=text)}]


CHAT_TOPICS = [
    ("I am planning a trip to {town} for {n} days.", ["What should I pack?", "Is it better to rent a car or take the bus?",
                                                      "Can you suggest a plan for the first day?", "How much money should I bring?"]),
    ("I just adopted a {pet}.", ["What should it eat?", "How often should I take it to the vet?",
                                 "How do I make my home safe for it?", "How much exercise does it need?"]),
    ("I want to cook dinner for {n} friends on Saturday.", ["What is a simple main course?", "What can I make in advance?",
                                                            "One friend is vegetarian. What should I change?",
                                                            "What dessert goes with it?"]),
    ("My {thing} stopped working this morning.", ["What should I check first?", "It still does not work. What next?",
                                                  "Is it worth repairing?", "How can I avoid this in the future?"]),
    ("I am learning {lang} and I practise every evening.", ["How can I remember new words?",
                                                            "Should I watch films with subtitles?",
                                                            "How long until I can have a simple conversation?",
                                                            "What mistakes do beginners make?"]),
    ("I need to write a report for my manager by {day}.", ["How should I structure it?", "How long should it be?",
                                                            "How do I write a good summary at the top?",
                                                            "Can you check the tone of my first sentence?"]),
]
PETS = ["kitten", "puppy", "rabbit", "parrot", "hamster", "tortoise", "guinea pig"]
THINGS = ["washing machine", "laptop", "car", "printer", "heater", "phone", "dishwasher", "router"]
CHAT_LANGS = ["Spanish", "Japanese", "German", "Portuguese", "Korean", "Dutch", "Arabic"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"]
REPLIES = ["Sure, happy to help. Could you tell me a bit more?", "Good question. Here are a few ideas to start with.",
           "That sounds exciting! Let us go through it step by step.", "Of course. First, a couple of basics.",
           "Thanks for the details. Here is what I would suggest."]


def multi_turn(rng: random.Random) -> Messages:
    """A chat of 2-3 user turns with short assistant replies in between, ending with the user."""
    opener, follow_ups = rng.choice(CHAT_TOPICS)
    first = opener.format(town=rng.choice(TOWNS), n=rng.randint(2, 9), pet=rng.choice(PETS),
                          thing=rng.choice(THINGS), lang=rng.choice(CHAT_LANGS), day=rng.choice(DAYS))
    asks = rng.sample(follow_ups, rng.randint(1, 3))
    messages = [{"role": "user", "content": f"{first} {asks[0]}"}]
    for ask in asks[1:]:
        messages += [{"role": "assistant", "content": rng.choice(REPLIES)}, {"role": "user", "content": ask}]
    return messages


def _percent(rng: random.Random) -> str:
    price, off = rng.randint(20, 400), rng.choice([10, 15, 20, 25, 30, 40, 50])
    return f"A {rng.choice(ITEMS)[0]} costs {price} euros and is on sale for {off}% off. What is the sale price?"


def _units(rng: random.Random) -> str:
    km, minutes = rng.randint(3, 40), rng.choice([15, 20, 30, 45, 50, 90])
    return f"{rng.choice(FIRST)} cycles {km} km in {minutes} minutes. What is the average speed in km per hour?"


def _equation(rng: random.Random) -> str:
    a, x, b = rng.randint(2, 9), rng.randint(-10, 15), rng.randint(1, 30)
    return f"Solve for y: {a}y + {b} = {a * x + b}"


def _shares(rng: random.Random) -> str:
    total, k = rng.randint(3, 30) * 12, rng.choice([2, 3, 4, 6])
    return (f"{k} friends share a bill of {total} euros equally, but one of them also pays a {rng.randint(2, 9)} "
            f"euro tip alone. How much does each friend pay?")


def _sequence(rng: random.Random) -> str:
    start, step = rng.randint(1, 20), rng.randint(2, 9)
    seq = ", ".join(str(start + i * step) for i in range(5))
    return f"What are the next two numbers in the sequence {seq}? Explain the rule."


def _area(rng: random.Random) -> str:
    w, h = rng.randint(2, 15), rng.randint(2, 15)
    return f"A rectangular garden is {w} m wide and {h} m long. What are its area and its perimeter?"


MATH_ASKS = ["", " Explain step by step.", " Show your work.", " Give only the final answer.", " Check your answer."]


def math(rng: random.Random) -> Messages:
    problem = rng.choice([_percent, _units, _equation, _shares, _sequence, _area])(rng)
    return [{"role": "user", "content": problem + rng.choice(MATH_ASKS)}]
