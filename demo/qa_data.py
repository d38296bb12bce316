"""The DEMO question-answering data: paragraphs about a building, a person, a company or an event.

Each kind of subject has facts; a fact is a few ways to state it and, for each value in it, a
few ways to ask for it. A paragraph states the subject's introduction and three to six other
facts in random order, with "it" / "she" / "the company" for the subject after the first
mention, and asks up to three questions. Values of one type recur in a paragraph (when work
began and when it opened; what it cost and what the old one cost), so the head must read the
question's verb to choose between them, not only the answer's type.

    >>> squad = qa_examples(1000, random.Random(0))    # SQuAD v1.1 JSON with 1000 questions
"""

from __future__ import annotations

import random
import string


def _words(text: str) -> list[str]:
    return [w.strip() for w in text.split("|")]


MONTHS = _words(
    "January|February|March|April|May|June|July|August|September|October|November|December"
)
SMALL = _words("two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|fifteen|twenty")
HEDGES = ["", "", "", "about ", "around ", "nearly ", "more than ", "almost ", "just over "]
FIRST = _words(
    "Amara|Tomasz|Ingrid|Rafael|Mei|Sven|Priya|Diego|Hannah|Yusuf|Chiara|Mateo|Aiko|Leila|Rosa|"
    "Nikolai|Fatou|Henrik|Camille|Arjun|Zeynep|Pablo|Greta|Kwame|Jonas|Marta|Tariq|Sophie|Oren"
)
LAST = _words(
    "Okonkwo|Lindqvist|Ferreira|Nakamura|Kowalczyk|Haddad|Moreau|Petrov|Gonzalez|Mbeki|Schneider|"
    "Rossi|Andersen|Kaya|Novak|Silva|Dubois|Osei|Horvath|Castillo|Nguyen|Brennan|Fischer|Rahman"
)
PLACES = _words(
    "Lyon|Krakow|Seville|Tampere|Gdansk|Porto|Valencia|Bergen|Leipzig|Turin|Nagoya|Busan|Lagos|"
    "Kampala|Quito|Lima|Manila|Hanoi|Perth|Halifax|Calgary|Denver|Glasgow|Cork|Antwerp|Graz|"
    "Bordeaux|Casablanca|Tunis|Tbilisi|Chennai|Cape Town|Buenos Aires|San Diego|Kuala Lumpur"
)
STEMS = _words(
    "Brightwater|Nordvik|Halden|Kestrel|Meridian|Orion|Alpina|Crescent|Bluepeak|Tessaro|Falkner|"
    "Zenith|Redwood|Lumen|Solis|Vantage|Ironbridge|Helix|Corvus|Aurora|Granite|Pinecrest|Marlow"
)
COMPANY_ENDS = _words("Inc.|Ltd|AG|Group|Systems|Foods|Motors|Energy|Media|Robotics|Software")
FIELDS = _words("medicine|law|chemistry|architecture|music|economics|physics|history|engineering")
PRODUCTS = _words(
    "bicycles|solar panels|frozen pizza|running shoes|hearing aids|electric buses|board games|"
    "coffee machines|garden tools|school books|wind turbines|sports cars|baby food|ski jackets"
)
THINGS = _words(
    "bridge|tunnel|stadium|library|tower|dam|concert hall|railway station|lighthouse|hospital|opera house|airport|museum|observatory"
)
EVENTS = _words(
    "Jazz Festival|Marathon|Book Fair|Film Festival|Food Festival|Science Fair|Chess Open|Regatta|Summit|Carnival"
)
# (what is counted, how the paragraph says it happened, how a question asks)
USES = [
    ("cars", "crossed it", "crossed {s}"),
    ("visitors", "came", "came to {s}"),
    ("passengers", "passed through it", "used {s}"),
    ("people", "visited it", "visited {s}"),
    ("cyclists", "rode across it", "rode across {s}"),
]
PUPILS = [
    ("teaches", "students", "teach"),
    ("coaches", "young players", "coach"),
    ("trains", "nurses", "train"),
]
WORKS = [("books", "wrote"), ("songs", "recorded"), ("patents", "filed"), ("films", "made")]


def _year(rng: random.Random) -> str:
    return str(rng.randint(1850, 2024))


def _date(rng: random.Random) -> str:
    day, month, year = rng.randint(1, 28), rng.choice(MONTHS), _year(rng)
    return rng.choice([f"{day} {month} {year}", f"{month} {day}, {year}"])


def _when(rng: random.Random) -> str:
    return rng.choice([_date, _year, lambda r: f"{r.choice(MONTHS)} {_year(r)}"])(rng)


def _count(rng: random.Random) -> str:
    shape = rng.random()
    if shape < 0.2:
        return rng.choice(SMALL)
    if shape < 0.5:
        return str(rng.randint(13, 999))
    if shape < 0.85:
        return f"{rng.randint(1, 99) * rng.choice([100, 1000]):,}"
    return f"{rng.randint(11, 99) / 10:g} million"


def _money(rng: random.Random) -> str:
    amount = rng.choice(
        [
            f"{rng.randint(11, 999) / 10:g} million",
            f"{rng.randint(2, 900)} million",
            f"{rng.randint(1, 99) * 1000:,}",
            str(rng.randint(5, 95)),
            f"{rng.randint(2, 30)} billion",
        ]
    )
    currency = rng.choice(["$", "€", "£", "dollars", "euros", "pounds", "francs", "yen"])
    return currency + amount if len(currency) == 1 else f"{amount} {currency}"


def _duration(rng: random.Random, units: tuple[str, ...] = ("months", "years")) -> str:
    if rng.random() < 0.15:
        return rng.choice(["a year and a half", "two and a half years", "a decade", "six weeks"])
    return f"{rng.choice(SMALL + [str(rng.randint(2, 40))])} {rng.choice(units)}"


def _time(rng: random.Random) -> str:
    """A race time or a short span: "2 hours and 24 minutes", "45 minutes"."""
    if rng.random() < 0.5:
        return f"{rng.randint(1, 9)} hours and {rng.randint(2, 59)} minutes"
    return f"{rng.randint(2, 59)} {rng.choice(['minutes', 'seconds'])}"


def _price(rng: random.Random) -> str:
    amount = str(rng.randint(3, 120)) + rng.choice(["", "", f".{rng.randint(1, 9)}0"])
    currency = rng.choice(["$", "€", "£", "dollars", "euros", "pounds"])
    return currency + amount if len(currency) == 1 else f"{amount} {currency}"


def _length(rng: random.Random) -> str:
    return f"{rng.randint(12, 3000):,} {rng.choice(['metres', 'meters', 'kilometres', 'feet', 'miles'])}"


def _person(rng: random.Random) -> str:
    return f"{rng.choice(FIRST)} {rng.choice(LAST)}"


def _company(rng: random.Random) -> str:
    return f"{rng.choice(STEMS)} {rng.choice(COMPANY_ENDS)}"


# fmt: off
VALUES = {  # slot name without its digit -> generator
    "DATE": _date, "YEAR": _year, "WHEN": _when, "COUNT": _count, "MONEY": _money,
    "DUR": _duration, "DAYS": lambda r: _duration(r, ("days", "weeks")), "TIME": _time,
    "PRICE": _price, "FEW": lambda r: r.choice(SMALL + [str(r.randint(13, 60))]), "LEN": _length, "PER": _person, "ORG": _company, "AGE": lambda r: str(r.randint(40, 99)),
    "PLACE": lambda r: r.choice(PLACES), "FIELD": lambda r: r.choice(FIELDS),
    "PRODUCT": lambda r: r.choice(PRODUCTS), "UNI": lambda r: f"the University of {r.choice(PLACES)}",
    "PRIZE": lambda r: f"the {r.choice(STEMS)} {r.choice(['Prize', 'Medal', 'Award'])}",
}

# A fact: (ways to state it, {slot: ways to ask for it}). {S} is the subject, {Ref} / {ref} it
# or its name, {refs} its possessive, {Q} the subject as a question names it, {H} a hedge
# ("about ") outside the answer. "[year]" marks a question only for a bare-year value.
Fact = tuple[list[str], dict[str, list[str]]]
BUILDING: list[Fact] = [
    (["{S} stands in {PLACE}.", "{S} is in the centre of {PLACE}.", "{S}, in {PLACE}, is the best known {thing} in the region."],
     {"PLACE": ["Where is {Q}?", "In which city is {Q}?", "Where does {Q} stand?"]}),
    (["Work on {ref} began in {WHEN}.", "Construction started in {WHEN}.", "Builders broke ground in {WHEN}."],
     {"WHEN": ["When did work on {Q} begin?", "When did construction start?", "When did building work on {Q} start?", "[year] In which year did construction begin?"]}),
    (["Building {ref} took {H}{DUR}.", "The construction lasted {H}{DUR}.", "The builders needed {H}{DUR} to finish {ref}."],
     {"DUR": ["How long did the construction take?", "How long did it take to build {Q}?", "How long did the work last?"]}),
    (["{Ref} opened to the public on {DATE}.", "{Ref} was opened to traffic on {DATE}, later than planned.", "The official opening was on {DATE}."],
     {"DATE": ["When did {Q} open?", "When was {Q} opened?", "On what date did {Q} open?", "When did {Q} open to the public?"]}),
    (["{Ref} cost {H}{MONEY}.", "The project cost {H}{MONEY} in the end.", "In total, {ref} cost {MONEY}."],
     {"MONEY": ["How much did {Q} cost?", "What did {Q} cost?", "How much money was spent on {Q}?", "What was the cost of {Q}?"]}),
    (["In the first {period}, {H}{COUNT} {unit} {did}.", "{H}{COUNT} {unit} {did} in the first {period}."],
     {"COUNT": ["How many {unit} {asked} in the first {period}?", "How many {unit} {asked}?"]}),
    (["{Ref} was designed by the architect {PER}.", "{PER} designed {ref}.", "The engineer behind {ref} was {PER}."],
     {"PER": ["Who designed {Q}?", "Who was the architect of {Q}?", "Who designed it?"]}),
    (["{Ref} is {LEN} long.", "At {LEN} long, {ref} was a record for its time."],
     {"LEN": ["How long is {Q}?", "What is the length of {Q}?"]}),
    (["Plans for {ref} were first approved in {YEAR2}.", "The city council approved the plans in {YEAR2}."],
     {"YEAR2": ["When were the plans approved?", "[year] In which year were the plans for {Q} approved?"]}),
    (["The old {thing} it replaced had cost only {MONEY2}.", "Its predecessor cost {MONEY2}."],
     {"MONEY2": ["How much did the old {thing} cost?", "What did the predecessor cost?"]}),
    (["{H}{COUNT2} workers built {ref}.", "A team of {COUNT2} workers did the job."],
     {"COUNT2": ["How many workers built {Q}?", "How many workers were there?"]}),
    (["The money came from {ORG} and the city.", "{ORG} paid for most of it."],
     {"ORG": ["Who paid for {Q}?", "Which company paid for {Q}?"]}),
    (["{Ref} reopened in {WHEN2} after a renovation that cost {MONEY3}.", "After a renovation costing {MONEY3}, {ref} reopened in {WHEN2}."],
     {"WHEN2": ["When did {Q} reopen?", "When did {Q} open again?"],
      "MONEY3": ["How much did the renovation cost?", "What did the renovation of {Q} cost?"]}),
    (["It has {COUNT3} {rooms} and employs {COUNT4} people.", "With {COUNT3} {rooms}, it employs about {COUNT4} people."],
     {"COUNT3": ["How many {rooms} does {Q} have?"], "COUNT4": ["How many people does {Q} employ?", "How many people work at {Q}?"]}),
]
PERSON: list[Fact] = [
    (["{S} was born in {PLACE} on {DATE}.", "{S} was born on {DATE} in {PLACE}."],
     {"DATE": ["When was {Q} born?", "What is {Q}'s date of birth?", "When was {she} born?"],
      "PLACE": ["Where was {Q} born?", "Where is {Q} from?", "In which city was {Q} born?"]}),
    (["{She} studied {FIELD} at {UNI}.", "At {UNI}, {she} studied {FIELD}."],
     {"FIELD": ["What did {Q} study?", "What subject did {Q} study?"],
      "UNI": ["Where did {Q} study?", "Which university did {Q} attend?"]}),
    (["In {YEAR2}, {she} moved to {PLACE2}.", "{She} moved to {PLACE2} in {YEAR2}."],
     {"YEAR2": ["When did {Q} move to {PLACE2}?", "[year] In which year did {she} move to {PLACE2}?"],
      "PLACE2": ["Where did {Q} move in {YEAR2}?", "Where did {Q} move to?"]}),
    (["{She} worked for {ORG} for {H}{DUR}.", "For {DUR}, {she} worked at {ORG}."],
     {"DUR": ["How long did {Q} work for {ORG}?", "For how long did {she} work at {ORG}?"],
      "ORG": ["Who did {Q} work for?", "Which company did {Q} work for?"]}),
    (["In {YEAR3}, {she} won {PRIZE}, worth {MONEY}.", "{She} won {PRIZE} in {YEAR3}; it came with {MONEY}."],
     {"MONEY": ["How much was the prize worth?", "How much money came with the prize?"],
      "YEAR3": ["When did {Q} win {PRIZE}?", "[year] In which year did {she} win the prize?"],
      "PRIZE": ["Which prize did {Q} win?", "What did {Q} win in {YEAR3}?"]}),
    (["Over the years {she} {made} {COUNT} {works}.", "All in all, {she} {made} {H}{COUNT} {works}."],
     {"COUNT": ["How many {works} did {Q} {make}?", "How many {works} did {she} {make}?"]}),
    (["{She} won {her} first {title} in {PLACE4} in {YEAR5}.", "In {YEAR5}, {she} won {her} first {title}, in {PLACE4}."],
     {"PLACE4": ["Where did {Q} win {her} first {title}?", "In which city did {she} win {her} first {title}?"],
      "YEAR5": ["When did {Q} win {her} first {title}?", "[year] In which year did {Q} win {her} first {title}?"]}),
    (["Today {she} lives in {PLACE5} and {teaches} {COUNT2} {pupils}.", "{She} now lives in {PLACE5}, where {she} {teaches} {COUNT2} {pupils}."],
     {"PLACE5": ["Where does {Q} live now?", "Where does {she} live today?"],
      "COUNT2": ["How many {pupils} does {Q} {teach}?", "How many {pupils} does {she} {teach}?"]}),
    (["{She} died in {PLACE3} in {YEAR4}, aged {AGE}.", "{She} died in {YEAR4} in {PLACE3} at the age of {AGE}."],
     {"YEAR4": ["When did {Q} die?", "[year] In which year did {Q} die?"],
      "PLACE3": ["Where did {Q} die?"], "AGE": ["How old was {Q} when {she} died?", "At what age did {Q} die?"]}),
]
COMPANY: list[Fact] = [
    (["{S} was founded in {WHEN} by {PER}.", "{PER} founded {S} in {WHEN}.", "{PER} started {S} in {WHEN} in a small shop in {PLACE}."],
     {"PER": ["Who founded {Q}?", "Who started {Q}?"],
      "WHEN": ["When was {Q} founded?", "When did {PER} start the company?", "[year] In which year was {Q} founded?", "[year] What year was {Q} started?"]}),
    (["{Ref} is based in {PLACE2}.", "{Refs} headquarters are in {PLACE2}."],
     {"PLACE2": ["Where is {Q} based?", "Where are {Q}'s headquarters?", "In which city is {Q} based?"]}),
    (["{Ref} makes {PRODUCT}.", "{Ref} is best known for its {PRODUCT}."],
     {"PRODUCT": ["What does {Q} make?", "What does {Q} produce?", "What is {Q} known for?"]}),
    (["{Ref} employs {H}{COUNT} people.", "{Ref} has {H}{COUNT} employees.", "The company now has {H}{COUNT} staff."],
     {"COUNT": ["How many people does {Q} employ?", "How many employees does {Q} have?", "How many people work for {Q}?"]}),
    (["In {YEAR2}, {refs} {kpi} reached {MONEY}.", "{Refs} {kpi} in {YEAR2} was {MONEY}."],
     {"MONEY": ["What was {Q}'s {kpi} in {YEAR2}?", "How much {kpi} did {Q} make in {YEAR2}?"]}),
    (["In {YEAR3}, {ref} bought {ORG2} for {MONEY2}.", "{Ref} paid {MONEY2} for {ORG2} in {YEAR3}."],
     {"MONEY2": ["How much did {Q} pay for {ORG2}?", "How much did {ORG2} cost {Q}?"],
      "ORG2": ["Which company did {Q} buy?", "What did {Q} buy in {YEAR3}?"],
      "YEAR3": ["When did {Q} buy {ORG2}?"]}),
    (["{Ref} runs {COUNT2} {sites} in {FEW} countries.", "By {YEAR5}, the company ran {COUNT2} {sites} and sold in {FEW} countries."],
     {"COUNT2": ["How many {sites} does {Q} run?"], "FEW": ["In how many countries does {Q} have {sites}?", "In how many countries does {Q} sell?"]}),
    (["{Refs} chief executive is {PER2}.", "Since {YEAR4}, {ref} has been run by {PER2}."],
     {"PER2": ["Who is the chief executive of {Q}?", "Who runs {Q}?", "Who is in charge of {Q}?"]}),
]
EVENT: list[Fact] = [
    (["{S} began on {DATE} in {PLACE}.", "{S} opened in {PLACE} on {DATE}."],
     {"DATE": ["When did {Q} begin?", "When did {Q} start?", "On what date did {Q} open?"],
      "PLACE": ["Where did {Q} take place?", "Where was {Q} held?"]}),
    (["{Ref} lasted {DAYS}.", "{Ref} ran for {DAYS}."],
     {"DAYS": ["How long did {Q} last?", "For how long did {Q} run?"]}),
    (["{H}{COUNT} people attended.", "{Ref} drew {H}{COUNT} visitors."],
     {"COUNT": ["How many people attended {Q}?", "How many visitors came?"]}),
    (["Tickets cost {PRICE}.", "A day ticket was {PRICE}."],
     {"PRICE": ["How much did tickets cost?", "How much was a ticket?", "What did a ticket cost?"]}),
    (["The organisers raised {MONEY2} for charity.", "{MONEY2} was raised for a children's hospital."],
     {"MONEY2": ["How much money was raised?", "How much did the organisers raise?"]}),
    (["{Ref} was organised by {PER}.", "{PER} organised {ref}."],
     {"PER": ["Who organised {Q}?", "Who was the organiser?"]}),
    (["The winner, {PER2}, finished in {TIME}.", "{PER2} won in {TIME}."],
     {"PER2": ["Who won {Q}?", "Who was the winner?"],
      "TIME": ["How long did the winner take?", "How long did it take {PER2} to finish?"]}),
    (["{S} was first held in {YEAR2}.", "The first edition was held in {YEAR2}."],
     {"YEAR2": ["When was {Q} first held?", "[year] In which year was {Q} first held?"]}),
]
# fmt: on


def _subject(kind: str, rng: random.Random) -> dict[str, str]:
    """The subject's names and pronouns, and the plain (never asked) words its facts use."""
    # fmt: off
    if kind == "person":
        name = _person(rng)
        she = rng.choice(["she", "he"])
        return {"S": name, "short": name.split()[-1], "it": she, "its": {"she": "her", "he": "his"}[she],
                "she": she, "She": she.title(), "her": {"she": "her", "he": "his"}[she],
                "title": rng.choice(["race", "title", "tournament", "election", "case", "award"]),
                **dict(zip(("teaches", "pupils", "teach"), rng.choice(PUPILS), strict=True)), "works": (w := rng.choice(WORKS))[0], "made": w[1],
                "make": {"wrote": "write", "recorded": "record", "filed": "file", "made": "make"}[w[1]]}
    if kind == "company":
        name = _company(rng)
        return {"S": name, "short": name, "it": rng.choice(["it", "the company"]), "its": "its",
                "kpi": rng.choice(["revenue", "profit"]), "sites": rng.choice(["shops", "factories", "offices"])}
    if kind == "building":
        thing = rng.choice(THINGS)
        name = f"the {rng.choice(LAST + PLACES)} {string.capwords(thing)}"
        unit, did, asked = rng.choice(USES)
        asked = asked.format(s=f"the {thing}")
        return {"S": name, "short": f"the {thing}", "it": "it", "its": "its", "thing": thing,
                "unit": unit, "did": did, "asked": asked, "rooms": rng.choice(["rooms", "floors", "halls", "beds"]), "period": rng.choice(["week", "month", "year"])}
    name = f"the {rng.choice(PLACES)} {rng.choice(EVENTS)}"
    return {"S": name, "short": name, "it": "it", "its": "its"}
    # fmt: on


def _render(template: str, values: dict[str, str]) -> tuple[str, dict[str, tuple[int, int]]]:
    """Fill a template; returns the text and each slot's character span in it."""
    text, spans = "", {}
    for literal, slot, _, _ in string.Formatter().parse(template):
        text += literal
        if slot is not None:
            value = values[slot]
            if not text.strip():  # first word of a sentence
                value = value[:1].upper() + value[1:]
            spans.setdefault(slot, (len(text), len(text) + len(value)))
            text += value
    return text, spans


KINDS = ["building", "person", "company", "event"]


def paragraph(
    rng: random.Random, kind: str | None = None
) -> tuple[str, list[tuple[str, str, int]]]:
    """(context, [(question, answer, answer_start)]) about a subject of `kind` (one of KINDS,
    drawn when None)."""
    kind = kind or rng.choice(KINDS)
    facts = {"building": BUILDING, "person": PERSON, "company": COMPANY, "event": EVENT}[kind]
    values = _subject(kind, rng)
    chosen = [facts[0], *rng.sample(facts[1:], rng.randint(2, 4))]
    context, answers = "", {}
    for n, (sentences, asks) in enumerate(chosen):
        template = rng.choice(sentences)
        for slot in string.Formatter().parse(template):
            name = slot[1]
            if name and name not in values:
                kind_of = name.rstrip("0123456789")
                while (value := VALUES[kind_of](rng)) in values.values():
                    pass  # two facts with one value would make the answer ambiguous
                values[name] = value
        values["H"] = rng.choice(HEDGES)
        values["Ref"] = values["ref"] = (
            values["S"] if rng.random() < 0.4 or n == 0 else values["it"]
        )
        values["Refs"] = values["refs"] = (
            f"{values['S']}'s" if rng.random() < 0.3 else values["its"]
        )
        text, spans = _render(template, values)
        start = len(context) + (1 if context else 0)
        context = f"{context} {text}" if context else text
        for slot in asks:
            if slot in spans:  # as written: a value that opens a sentence is capitalised
                a, b = spans[slot]
                answers[slot] = (text[a:b], start + a)
    questions = []
    for slot in rng.sample(sorted(answers), min(3, len(answers))):
        asks = next(a[slot] for _, a in chosen if slot in a)
        value, start = answers[slot]
        options = [
            q.removeprefix("[year] ") for q in asks if not q.startswith("[year]") or value.isdigit()
        ]
        values["Q"] = rng.choice([values["S"], values["S"], values["short"]])
        question, _ = _render(rng.choice(options), values)
        questions.append((question, value, start))
    return context, questions


def qa_examples(n: int, rng: random.Random) -> dict:
    """SQuAD v1.1 JSON with `n` questions, one paragraph per generated context."""
    paragraphs, total = [], 0
    while total < n:
        context, questions = paragraph(rng)
        qas = [
            {
                "id": f"demo-{len(paragraphs)}-{j}",
                "question": q,
                "answers": [{"text": a, "answer_start": s}],
            }
            for j, (q, a, s) in enumerate(questions[: n - total])
        ]
        paragraphs.append({"context": context, "qas": qas})
        total += len(qas)
    return {"version": "demo", "data": [{"title": "demo", "paragraphs": paragraphs}]}
