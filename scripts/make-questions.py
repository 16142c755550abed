#!/usr/bin/env python3
"""Writes data/cascade/questions.jsonl: short questions with checkable answers for
`frugal eval-route` (the cascade's cost/quality curve). Deterministic (seeded).

Each line: {"id", "kind", "question", "answers": [accepted...], "check"}; check is
"contains" (an accepted answer appears as a whole phrase, case-insensitive), "last_number"
or "first_number" (that number in the reply equals the answer).
"""
import json, pathlib, random

rng = random.Random(20261203)
items = []

def add(kind, question, answers, check="contains"):
    items.append({"kind": kind, "question": question, "answers": answers, "check": check})

CAPITALS = [
    ("France", "Paris"), ("Germany", "Berlin"), ("Italy", "Rome"), ("Spain", "Madrid"),
    ("Portugal", "Lisbon"), ("the United Kingdom", "London"), ("Ireland", "Dublin"),
    ("Japan", "Tokyo"), ("China", "Beijing"), ("India", "New Delhi"), ("Russia", "Moscow"),
    ("Egypt", "Cairo"), ("Greece", "Athens"), ("Austria", "Vienna"), ("Hungary", "Budapest"),
    ("Poland", "Warsaw"), ("Sweden", "Stockholm"), ("Norway", "Oslo"), ("Finland", "Helsinki"),
    ("Denmark", "Copenhagen"), ("the Netherlands", "Amsterdam"), ("Belgium", "Brussels"),
    ("Switzerland", "Bern"), ("Canada", "Ottawa"), ("Australia", "Canberra"),
    ("Brazil", "Brasilia"), ("Argentina", "Buenos Aires"), ("Mexico", "Mexico City"),
    ("Peru", "Lima"), ("Chile", "Santiago"), ("Colombia", "Bogota"), ("Venezuela", "Caracas"),
    ("Cuba", "Havana"), ("Kenya", "Nairobi"), ("Nigeria", "Abuja"), ("Ethiopia", "Addis Ababa"),
    ("Morocco", "Rabat"), ("Ghana", "Accra"), ("South Korea", "Seoul"), ("North Korea", "Pyongyang"),
    ("Thailand", "Bangkok"), ("Vietnam", "Hanoi"), ("Indonesia", "Jakarta"),
    ("the Philippines", "Manila"), ("Malaysia", "Kuala Lumpur"), ("Pakistan", "Islamabad"),
    ("Bangladesh", "Dhaka"), ("Iran", "Tehran"), ("Iraq", "Baghdad"), ("Saudi Arabia", "Riyadh"),
    ("Turkey", "Ankara"), ("Israel", "Jerusalem"), ("Syria", "Damascus"), ("Lebanon", "Beirut"),
    ("Afghanistan", "Kabul"), ("Nepal", "Kathmandu"), ("Ukraine", "Kyiv"), ("Romania", "Bucharest"),
    ("Bulgaria", "Sofia"), ("Serbia", "Belgrade"), ("Croatia", "Zagreb"),
    ("the Czech Republic", "Prague"), ("Slovakia", "Bratislava"), ("Iceland", "Reykjavik"),
    ("New Zealand", "Wellington"), ("Qatar", "Doha"), ("Jordan", "Amman"), ("Libya", "Tripoli"),
    ("Sudan", "Khartoum"), ("Uganda", "Kampala"), ("Zimbabwe", "Harare"), ("Senegal", "Dakar"),
    ("Algeria", "Algiers"), ("Tunisia", "Tunis"), ("Mongolia", "Ulaanbaatar"),
    ("Kazakhstan", "Astana"), ("Uzbekistan", "Tashkent"), ("Ecuador", "Quito"),
    ("Bolivia", "Sucre"), ("Uruguay", "Montevideo"), ("Paraguay", "Asuncion"),
]
for country, city in CAPITALS:
    accepted = [city]
    if city == "Sucre":
        accepted.append("La Paz")
    if city == "Kyiv":
        accepted.append("Kiev")
    if city == "Brasilia":
        accepted.append("Brasília")
    if city == "Bogota":
        accepted.append("Bogotá")
    if city == "Astana":
        accepted.append("Nur-Sultan")
    add("capital", f"What is the capital of {country}?", accepted)

for _ in range(60):
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    add("addition", f"What is {a} + {b}?", [str(a + b)], "last_number")

for _ in range(40):
    a, b = rng.randint(3, 12), rng.randint(3, 12)
    add("multiplication", f"What is {a} times {b}?", [str(a * b)], "last_number")

for _ in range(30):
    a, b = rng.sample(range(11, 99), 2)
    add("compare", f"Which number is larger, {a} or {b}? Answer with the number.", [str(max(a, b))], "first_number")

ELEMENTS = [
    ("gold", "Au"), ("silver", "Ag"), ("iron", "Fe"), ("oxygen", "O"), ("hydrogen", "H"),
    ("carbon", "C"), ("nitrogen", "N"), ("sodium", "Na"), ("potassium", "K"), ("copper", "Cu"),
    ("lead", "Pb"), ("helium", "He"), ("calcium", "Ca"), ("zinc", "Zn"), ("mercury", "Hg"),
    ("tin", "Sn"), ("chlorine", "Cl"), ("sulfur", "S"), ("uranium", "U"), ("neon", "Ne"),
    ("magnesium", "Mg"), ("aluminium", "Al"), ("silicon", "Si"), ("phosphorus", "P"),
    ("platinum", "Pt"),
]
for name, sym in ELEMENTS:
    add("element", f"What is the chemical symbol for {name}?", [sym])

ANTONYMS = [
    ("hot", ["cold"]), ("up", ["down"]), ("big", ["small", "little"]), ("happy", ["sad", "unhappy"]),
    ("fast", ["slow"]), ("light", ["dark", "heavy"]), ("open", ["closed", "close", "shut"]),
    ("young", ["old"]), ("rich", ["poor"]), ("early", ["late"]), ("full", ["empty"]),
    ("hard", ["soft", "easy"]), ("wet", ["dry"]), ("strong", ["weak"]), ("high", ["low"]),
    ("long", ["short"]), ("win", ["lose"]), ("love", ["hate"]), ("true", ["false"]),
    ("inside", ["outside"]), ("begin", ["end", "finish"]), ("buy", ["sell"]),
    ("push", ["pull"]), ("north", ["south"]), ("day", ["night"]), ("black", ["white"]),
    ("thick", ["thin"]), ("clean", ["dirty"]), ("cheap", ["expensive"]), ("alive", ["dead"]),
]
for word, opposites in ANTONYMS:
    add("antonym", f"What is the opposite of the word \"{word}\"?", opposites)

COUNTS = [
    ("How many days are in a week?", "7"), ("How many months are in a year?", "12"),
    ("How many legs does a spider have?", "8"), ("How many sides does a triangle have?", "3"),
    ("How many sides does a hexagon have?", "6"), ("How many hours are in a day?", "24"),
    ("How many minutes are in an hour?", "60"), ("How many continents are there?", "7"),
    ("How many planets are in our solar system?", "8"), ("How many legs does an insect have?", "6"),
    ("How many sides does a square have?", "4"), ("How many seconds are in a minute?", "60"),
    ("How many days are in a leap year?", "366"), ("How many sides does an octagon have?", "8"),
    ("How many strings does a standard guitar have?", "6"), ("How many players are on a soccer team on the field?", "11"),
    ("How many wheels does a bicycle have?", "2"), ("How many cents are in a dollar?", "100"),
    ("How many years are in a century?", "100"), ("How many sides does a pentagon have?", "5"),
]
for q, n in COUNTS:
    add("count", q, [n], "last_number")

AUTHORS = [
    ("Romeo and Juliet", ["Shakespeare"]), ("Hamlet", ["Shakespeare"]),
    ("Pride and Prejudice", ["Austen"]), ("1984", ["Orwell"]), ("Animal Farm", ["Orwell"]),
    ("War and Peace", ["Tolstoy"]), ("The Odyssey", ["Homer"]), ("Don Quixote", ["Cervantes"]),
    ("Moby-Dick", ["Melville"]), ("Oliver Twist", ["Dickens"]), ("A Christmas Carol", ["Dickens"]),
    ("The Origin of Species", ["Darwin"]), ("Harry Potter and the Philosopher's Stone", ["Rowling"]),
    ("The Old Man and the Sea", ["Hemingway"]), ("Crime and Punishment", ["Dostoevsky", "Dostoyevsky"]),
    ("The Divine Comedy", ["Dante"]), ("Frankenstein", ["Shelley"]), ("Dracula", ["Stoker"]),
    ("The Hobbit", ["Tolkien"]), ("Macbeth", ["Shakespeare"]),
]
for book, who in AUTHORS:
    add("author", f"Who wrote {book}?", who)

for i, it in enumerate(items):
    it["id"] = i
out = pathlib.Path(__file__).resolve().parent.parent / "data" / "cascade" / "questions.jsonl"
out.parent.mkdir(parents=True, exist_ok=True)
with open(out, "w") as f:
    for it in items:
        f.write(json.dumps({k: it[k] for k in ("id", "kind", "question", "answers", "check")}) + "\n")
print(f"{len(items)} questions -> {out}")
